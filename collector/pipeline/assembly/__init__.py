"""Assembly: completed conversations read back from the span store, built (mapped, composed, checked) in worker
processes, and written as versions with their jobs, scores and summary rows."""
