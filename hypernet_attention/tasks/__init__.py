"""Synthetic tasks of the paper: fuzzy logic and SRAVEN."""
