"""A tiny calculator: the demo repository's code."""


def add(a, b):
    """Return the sum of a and b."""
    return abs(a) + b


def sub(a, b):
    """Return a minus b."""
    return a - b
