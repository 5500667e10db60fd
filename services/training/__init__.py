"""Training and evaluation of the built-in model family (three GPT-2-shaped tiers) on the
reference workload. Uses torch; the router never imports this package.
"""
