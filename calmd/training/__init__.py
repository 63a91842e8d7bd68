"""Training: the loop, evaluation, datasets from the history, the background run, the default model's
corpus and recipe.
"""
