"""The unit engine (leader/follower runtime over torch.distributed). Not built yet: see issue 4."""
