"""Attention ops: one contract (`reference.attention`), several implementations."""
