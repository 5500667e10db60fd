"""The fictional shop behind the workload: its catalogue, policies, coupons and shipping rule.

Everything is derived from a seed, so the same seed always gives the same shop. Knows nothing
of requests, splits, tokenizers or models.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

COLOURS = (
    "red", "blue", "green", "black", "white", "grey", "yellow", "orange",
    "purple", "pink", "brown", "silver", "golden", "navy", "teal", "ivory",
)  # fmt: skip
NOUNS = (
    "mug", "lamp", "kettle", "towel", "pillow", "blanket", "backpack", "notebook",
    "candle", "vase", "clock", "jacket", "sweater", "sock", "glove", "hat",
    "bottle", "plate", "bowl", "spoon", "chair", "stool", "rug", "mirror",
    "basket", "bucket", "umbrella", "wallet", "belt", "helmet", "pen", "pencil",
    "speaker", "charger", "cable", "keyboard", "mouse", "tent", "jar", "tray",
)  # fmt: skip

FREE_SHIPPING_FROM = 100  # orders whose discounted subtotal is at least this ship free
SHIPPING_FEE = 7  # dollars, charged below FREE_SHIPPING_FROM
COUPONS = {"SAVE5": 5, "SAVE10": 10, "SAVE20": 20}  # code -> dollars off the subtotal
# the reply to a question outside the shop's domain (no policy, product or order behind it)
FALLBACK_ANSWER = (
    "Sorry, I can only answer questions about this shop's products, prices and policies."
)


@dataclass(frozen=True)
class Product:
    """One catalogue entry: a name like "blue mug" and a whole-dollar price."""

    name: str
    price: int

    @property
    def plural(self) -> str:
        return self.name + "s"


@dataclass(frozen=True)
class Policy:
    """One FAQ topic: the question's paraphrases and the one answer sentence."""

    topic: str
    questions: tuple[str, ...]
    answer: str


POLICIES = (
    Policy(
        "returns",
        (
            "What is your return policy?",
            "Can I return an item?",
            "How do returns work?",
            "How many days do I have to return something?",
            "Can I send back an order I do not want?",
            "What is the policy on returning products?",
        ),
        "You can return any unused item within 30 days of delivery for a full refund.",
    ),
    Policy(
        "shipping",
        (
            "How much is shipping?",
            "Do you offer free shipping?",
            "What does delivery cost?",
            "What are your shipping charges?",
            "When is shipping free?",
            "How much do you charge for delivery?",
        ),
        f"Shipping is free on orders of ${FREE_SHIPPING_FROM} or more; "
        f"otherwise it costs ${SHIPPING_FEE}.",
    ),
    Policy(
        "delivery_time",
        (
            "How long does delivery take?",
            "When will my order arrive?",
            "How fast do you ship?",
            "How many days until my package arrives?",
            "What is the delivery time?",
        ),
        "Orders arrive within 3 to 5 business days after they ship.",
    ),
    Policy(
        "refund_time",
        (
            "How long does a refund take?",
            "When will I get my money back?",
            "How soon are refunds paid?",
            "When is my refund processed?",
        ),
        "Refunds are paid to your original payment method within 7 days of receiving the return.",
    ),
    Policy(
        "coupons",
        (
            "How do coupons work?",
            "Can I use a discount code?",
            "What coupon codes do you have?",
            "Do you have any discounts?",
            "How do I use a coupon?",
        ),
        "Coupons SAVE5, SAVE10 and SAVE20 take $5, $10 or $20 off the subtotal, one per order.",
    ),
    Policy(
        "payment",
        (
            "What payment methods do you accept?",
            "Can I pay by card?",
            "How can I pay for my order?",
            "Which ways of paying do you take?",
        ),
        "We accept credit cards, debit cards and gift cards.",
    ),
    Policy(
        "cancel",
        (
            "Can I cancel my order?",
            "How do I cancel an order?",
            "Is it possible to cancel after ordering?",
            "What if I want to cancel my purchase?",
        ),
        "You can cancel an order free of charge until it ships.",
    ),
    Policy(
        "warranty",
        (
            "Do your products have a warranty?",
            "What warranty do you offer?",
            "Is there a guarantee on items?",
            "What happens if my item breaks?",
        ),
        "Every product carries a one year warranty against defects.",
    ),
    Policy(
        "hours",
        (
            "When is customer service open?",
            "What are your support hours?",
            "When can I reach support?",
            "What time is your help desk open?",
        ),
        "Customer service is open every day from 8 am to 8 pm.",
    ),
    Policy(
        "international",
        (
            "Do you ship abroad?",
            "Do you deliver to other countries?",
            "Is international shipping available?",
            "Can you send orders overseas?",
        ),
        "We ship only within the country for now.",
    ),
)


@dataclass(frozen=True)
class Store:
    """The catalogue (every product) and its popular subset (the products simple lookups ask)."""

    products: tuple[Product, ...]
    popular: tuple[Product, ...]

    def price(self, name: str) -> int:
        for product in self.products:
            if product.name == name:
                return product.price
        raise KeyError(name)


def build_store(seed: int, catalogue_size: int, popular_size: int) -> Store:
    """Draws `catalogue_size` distinct products with prices $5-$99; the first `popular_size`
    of them (in draw order) are the popular ones."""
    names = [f"{colour} {noun}" for colour in COLOURS for noun in NOUNS]
    if not 0 < popular_size <= catalogue_size <= len(names):
        raise ValueError(
            f"need 0 < popular_size <= catalogue_size <= {len(names)}, "
            f"got popular_size={popular_size}, catalogue_size={catalogue_size}"
        )
    rng = random.Random(seed)
    chosen = rng.sample(names, catalogue_size)
    products = tuple(Product(name, rng.randint(5, 99)) for name in chosen)
    return Store(products=products, popular=products[:popular_size])
