"""Prompts the engine tests batch together: short and long, so prefill and decode mix rows of
different lengths."""

PROMPTS = [
    "What is your return policy?",
    "How much does the blue kettle cost?",
    "Hi",
    "Shipping is free on orders over 50 dollars. Delivery takes 3 to 5 days. When?",
    "The total for 2 mugs",
    "Hello, thank you",
]
