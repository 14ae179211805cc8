"""The labelled validity corpus and its generator; `bench/validity.py` runs judges over it."""
