"""People and the judge: end-user feedback in, review queues, reviewers' verdicts, and calibration from them."""
