"""The tiny AutoGnothi configuration and sentences the AutoGnothi library tests share."""

TINY = {"sentences": 24, "pairs": 4, "epochs": 3, "batch_size": 8, "held_out": 0, "seed": 5}
TEXTS = ["The food was awful but the staff were very friendly.", "A lovely, quiet hotel!"]
