"""PyTorch: the model, its layers and config, checkpoints, and importers of users' checkpoints."""

# what `--arch` names for a state dict file; "auto" recognises one of the others from the keys
STATE_DICT_ARCHS = ("auto", "torch-nn-transformer", "seed-000", "seed-001", "seed-002", "seed-003", "seed-004")
