"""Training-only augmentation: simple and medium requests reworded so a model learns the question,
not the string, and off-domain questions answered with store.FALLBACK_ANSWER.

Every wording here is training-only and disjoint from the held-out ones (phrasings.py): other
paraphrase templates, other policy questions, other off-domain questions, other greetings and
sentences of context. Surface noise (casing, punctuation, a typo, a quantity as a word) reuses
phrasings' edits, seeded apart from them. The trainer additionally drops any augmented prompt
that is a dev or test prompt, so no held-out prompt is ever shown to a model. train.jsonl is not
touched: it holds the seen items the routing labels are measured on.

Knows the shop and the seen and held-out wordings; nothing of files, tokenizers or models.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

from services.workload.generator import (
    LOOKUP_TEMPLATES,
    MEDIUM_TEMPLATES,
    STORE,
    RequestClass,
    WorkloadItem,
    lookup_answer,
    medium_answer,
    stream,
)
from services.workload.phrasings import (
    NUMBER_WORDS,
    Transform,
    _lower,
    _punctuation,
    _typo,
    _upper,
    greeted,
)
from services.workload.store import FALLBACK_ANSWER, POLICIES, Store

AUGMENTED_CLASSES: tuple[RequestClass, ...] = ("simple", "medium")
PLAIN_SHARE = 0.3  # of augmented-class items: the seen item as the generator makes it
UNKNOWN_SHARE = 0.12  # of reworded simple items: an off-domain question
NEW_WORDING_SHARE = 0.6  # of reworded items: a training-only template or question

TRAIN_POLICY_QUESTIONS: dict[str, tuple[str, ...]] = {
    "returns": (
        "Can I return something I bought?",
        "I want to return a product.",
        "Is it possible to return my order?",
        "What if I do not like what I ordered?",
        "How do I send an item back?",
        "Returns: how do they work?",
        "Do you take back unused items?",
        "What is the return window?",
        "Can I return an unused item for a refund?",
        "return policy",
    ),
    "shipping": (
        "How much does shipping cost?",
        "What is the shipping fee?",
        "Do I pay for shipping?",
        "Is delivery free?",
        "How much is delivery?",
        "What are the delivery charges?",
        "When do I get free shipping?",
        "Shipping price?",
        "What do you charge to ship an order?",
        "shipping cost",
    ),
    "delivery_time": (
        "How long will my order take to arrive?",
        "When does my order get here?",
        "How long does shipping take?",
        "How many days does delivery take?",
        "When will my package come?",
        "How quickly will I get my order?",
        "Delivery time?",
        "How soon will my parcel arrive?",
        "When can I expect my order?",
        "delivery time",
    ),
    "refund_time": (
        "How long until my refund arrives?",
        "When do I get my refund?",
        "How fast are refunds?",
        "When will my money be refunded?",
        "How many days does a refund take?",
        "Refund time?",
        "How long do refunds take to come through?",
        "refund time",
    ),
    "coupons": (
        "Do you have coupons?",
        "Which discount codes can I use?",
        "Are there any coupon codes?",
        "How do discount codes work?",
        "Is there a promo code?",
        "Can I use a coupon on my order?",
        "Discount codes?",
        "What discounts do you offer?",
        "coupon codes",
    ),
    "payment": (
        "Which payment methods do you take?",
        "Can I pay with a debit card?",
        "Do you accept gift cards?",
        "How do I pay?",
        "What forms of payment do you accept?",
        "Can I pay with a credit card?",
        "Payment methods?",
        "What ways can I pay?",
        "payment options",
    ),
    "cancel": (
        "Can I cancel an order?",
        "How do I cancel my purchase?",
        "Is it too late to cancel my order?",
        "I want to cancel.",
        "Can an order be cancelled?",
        "How can I cancel my order?",
        "Cancel my order?",
        "Can I still cancel?",
        "cancel order",
    ),
    "warranty": (
        "Do products come with a warranty?",
        "What is the warranty?",
        "Is there a guarantee?",
        "What if my product is broken?",
        "How long does the warranty last?",
        "Are items covered by a warranty?",
        "Warranty?",
        "My item is defective, what now?",
        "warranty info",
    ),
    "hours": (
        "What are your opening times?",
        "When is support available?",
        "When are you available?",
        "What hours is customer service open?",
        "When can I contact customer service?",
        "Support hours?",
        "Is customer service open today?",
        "At what time does support open?",
        "opening hours",
    ),
    "international": (
        "Do you ship to other countries?",
        "Can you ship outside the country?",
        "Do you deliver abroad?",
        "Is there international delivery?",
        "Can I get an order shipped overseas?",
        "Do you ship worldwide?",
        "International shipping?",
        "Can you deliver to another country?",
        "ship abroad",
    ),
}
TRAIN_UNKNOWN_QUESTIONS = (
    "What time is it?",
    "Who won the game last night?",
    "Can you recommend a good movie?",
    "How do I cook pasta?",
    "What is two plus two?",
    "Translate hello into Spanish.",
    "What is the meaning of life?",
    "How tall is Mount Everest?",
    "Write a story about a dragon.",
    "Sing me a song.",
    "Who is the president?",
    "What is the best phone to buy?",
    "How do I fix my car?",
    "What should I eat for dinner?",
    "Do you like music?",
    "Are you a robot?",
    "What is your name?",
    "How old are you?",
    "Can you book me a flight?",
    "Will it rain tomorrow?",
    "What is the stock market doing?",
    "Explain quantum physics.",
    "Do you have a mobile app?",
    "Are you hiring?",
    "What is your email address?",
    "Can I visit your warehouse?",
    "Who is the owner of this shop?",
    "Do you have a newsletter?",
    "Can I become a seller on your site?",
    "How do I create an account?",
    "Can I change my username?",
    "Do you have a store near me?",
    "What is your address?",
    "Can I talk to a human?",
    "How do I log in?",
    "I forgot my password.",
    "Do you have a rewards card?",
    "Where are your products made?",
    "Is your website secure?",
    "Can I write a review?",
    "Do you offer gift boxes?",
    "Can I pick up my order in person?",
    "What is your fax number?",
    "Do you sell food?",
    "Can I order by mail?",
    "Who designs your products?",
    "Do you do repairs?",
    "Is there a size chart?",
    "How far away is the moon?",
    "What day is it today?",
    "Can you do my taxes?",
    "Recommend a book to read.",
    "What is the best pizza topping?",
    "How many people live in China?",
    "Can you order me a taxi?",
    "What is the population of Canada?",
    "Play some music for me.",
    "How do I lose weight?",
    "What is the news today?",
    "Solve this equation for me.",
    "Who painted the Mona Lisa?",
    "What is the temperature outside?",
    "Is it going to snow this week?",
    "How do I change my account email?",
    "Can I delete my account?",
    "Why can I not sign in?",
    "Do you have a shop in my town?",
    "Where is your head office?",
    "Can I work for you?",
    "Do you have job openings?",
    "Can I talk to your boss?",
    "Let me speak to someone in charge.",
    "Do you have a members club?",
    "Do I get points when I buy?",
    "Do you wrap presents?",
    "Can you put a ribbon on my parcel?",
    "Do you sell flowers?",
    "Do you sell cars?",
    "Can you give me legal advice?",
    "What is a good name for a dog?",
    "Tell me something funny.",
    "Write me a letter.",
    "Can you draw a picture?",
    "What is your favourite colour?",
    "Are you a real person?",
    "Do you have a phone line?",
    "Can I call you?",
    "Who founded this company?",
    "Where do your products come from?",
    "Do you have a catalogue in print?",
    "Can I pay in bitcoin?",
    "Do you rent products?",
    "Can I sell my old things to you?",
    "What is the wifi password?",
    "Help me plan a holiday.",
    "Where can I park?",
    "Do you have a blog?",
    "How do I unsubscribe from your emails?",
)
TRAIN_LOOKUP_TEMPLATES = (
    "How much for the {item}?",
    "What do you charge for the {item}?",
    "How much does a {item} cost?",
    "Price of {item}?",
    "What is the cost of the {item}?",
    "Tell me the price of the {item}.",
    "The {item} costs how much?",
    "How expensive is the {item}?",
    "What does one {item} cost?",
    "Can you tell me the price of the {item}?",
    "{item} price?",
    "I would like to know the price of the {item}.",
    "What's the {item} price?",
    "How much is a {item}?",
    "what is the {item} price",
)
TRAIN_MEDIUM_TEMPLATES = (
    "How much for {qty} {items}?",
    "What do {qty} {items} cost?",
    "What is the cost of {qty} {items}?",
    "Total price for {qty} {items}?",
    "I would like {qty} {items}. What is the price?",
    "How much will {qty} {items} cost?",
    "Tell me the price of {qty} {items}.",
    "{qty} {items} cost how much?",
    "What do I pay for {qty} {items}?",
    "Can you price {qty} {items}?",
    "I am buying {qty} {items}, how much is it?",
    "How much are {qty} {items}?",
    "What would I pay for {qty} {items}?",
    "Cost of {qty} {items}?",
    "how much is {qty} {items}",
)
TRAIN_GREETINGS = (
    "Hiya!",
    "Yo,",
    "Hey there!",
    "Good evening,",
    "Greetings.",
    "Good afternoon,",
    "Hi folks!",
    "Dear shop,",
    "Hello team,",
    "Morning!",
    "Hey hey,",
    "Hi again.",
    "Hello there!",
    "Hi everyone!",
    "Hey shop,",
    "Hello friends,",
    "Good day.",
    "Howdy,",
    "Hi team!",
    "Hello again,",
    "Evening!",
    "Hey folks,",
)
TRAIN_CONTEXTS = (
    "I ordered from you before.",
    "I am buying for my family.",
    "A friend told me about you.",
    "I am looking at your catalogue.",
    "Sorry to bother you.",
    "I need some help.",
    "I am planning a purchase.",
    "This is my first order.",
    "I saw your advert.",
    "I am comparing shops.",
    "Thanks in advance.",
    "Just wondering.",
    "I am on your website now.",
    "My sister recommended you.",
    "I have a small question.",
    "I am a returning customer.",
    "I am buying a present.",
    "I saw your shop on social media.",
    "One more thing.",
    "I have a query.",
    "I shop here often.",
    "I am new here.",
    "It is for my mother.",
    "I am in a hurry.",
    "Please help.",
    "I am thinking of ordering.",
    "I got your email.",
    "I placed an order yesterday.",
    "I am a first time buyer.",
    "I browsed your site today.",
    "Can you help me?",
    "I need to know something.",
    "Forgive the question.",
    "I am buying for work.",
    "This is urgent.",
    "I am a student.",
    "My friend shops here.",
    "Hope you are well.",
    "I have been looking around.",
    "Short question.",
)
UPPER_SHARE = 0.15  # of surface-noised texts: all in capitals (and nothing else changed)


def _greeting(text: str, _protected: frozenset[str], rng: random.Random) -> str:
    return greeted(rng.choice(TRAIN_GREETINGS), text)


def _context(text: str, _protected: frozenset[str], rng: random.Random) -> str:
    return f"{rng.choice(TRAIN_CONTEXTS)} {text}"


# in the order they apply; upper case comes alone, UPPER_SHARE of the time (capitals are other
# tokens altogether, so a model needs them more often than one edit in six)
TRAIN_TRANSFORMS: tuple[Transform, ...] = (_lower, _upper, _punctuation, _typo, _context, _greeting)


def surface_noise(text: str, protected: frozenset[str], rng: random.Random, least: int) -> str:
    """The text with `least` to 2 seeded surface edits: casing, punctuation, one typo (never in a
    protected word), a training-only sentence of context and/or greeting before it."""
    if rng.random() < UPPER_SHARE:
        return _upper(text, protected, rng)
    others = [i for i, edit in enumerate(TRAIN_TRANSFORMS) if edit is not _upper]
    chosen = rng.sample(others, rng.randint(least, 2))
    for index in sorted(chosen):
        text = TRAIN_TRANSFORMS[index](text, protected, rng)
    return text


def _reworded_simple(rng: random.Random, store: Store) -> tuple[str, str, str]:
    """(prompt, reference, final) of a reworded FAQ, price lookup or off-domain question."""
    if rng.random() < UNKNOWN_SHARE:
        prompt = surface_noise(rng.choice(TRAIN_UNKNOWN_QUESTIONS), frozenset(), rng, least=0)
        return prompt, FALLBACK_ANSWER, FALLBACK_ANSWER
    new = rng.random() < NEW_WORDING_SHARE
    if rng.random() < 0.5:
        policy = rng.choice(POLICIES)
        base = rng.choice(TRAIN_POLICY_QUESTIONS[policy.topic] if new else policy.questions)
        prompt = surface_noise(base, frozenset(), rng, least=0 if new else 1)
        return prompt, policy.answer, policy.answer
    product = rng.choice(store.popular)
    template = rng.choice(TRAIN_LOOKUP_TEMPLATES if new else LOOKUP_TEMPLATES)
    protected = frozenset(product.name.split())
    prompt = surface_noise(template.format(item=product.name), protected, rng, 0 if new else 1)
    return prompt, *lookup_answer(product)


def _reworded_medium(rng: random.Random, store: Store) -> tuple[str, str, str]:
    """(prompt, reference, final) of a reworded quantity question, the quantity maybe a word."""
    product = rng.choice(store.products)
    qty = rng.randint(2, 9)
    new = rng.random() < NEW_WORDING_SHARE
    as_word = rng.random() < 0.25
    template = rng.choice(TRAIN_MEDIUM_TEMPLATES if new else MEDIUM_TEMPLATES)
    prompt = template.format(qty=NUMBER_WORDS[qty] if as_word else qty, items=product.plural)
    if prompt[0].islower() and rng.random() < 0.7:
        prompt = prompt[0].upper() + prompt[1:]
    protected = frozenset(product.plural.split()) | {NUMBER_WORDS[qty]}
    prompt = surface_noise(prompt, protected, rng, least=0 if new or as_word else 1)
    return prompt, *medium_answer(product, qty)


def augmented_stream(
    seed: int,
    request_class: RequestClass,
    held_out: frozenset[str] = frozenset(),
    store: Store = STORE,
) -> Iterator[WorkloadItem]:
    """Endless training items of one class: the generator's stream, with simple and medium items
    reworded (PLAIN_SHARE of them left as they are). A reworded prompt that is in `held_out`
    (the dev and test prompts) is dropped. Complex items pass through unchanged; so does the
    generator's stream for a plain item (the caller filters those as before)."""
    rng = random.Random(f"{seed}:{request_class}:augment")
    for item in stream(seed, request_class, store):
        if request_class not in AUGMENTED_CLASSES or rng.random() < PLAIN_SHARE:
            yield item
            continue
        build = _reworded_simple if request_class == "simple" else _reworded_medium
        prompt, reference, final = build(rng, store)
        if prompt in held_out:
            continue
        yield WorkloadItem(f"{item.id}-aug", request_class, prompt, reference, final)
