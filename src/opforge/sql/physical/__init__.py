"""Physical relational operators over whole-column batches (one operator per module)."""
