"""Model weights from the Hugging Face Hub: the fetcher a Job runs and what it reports."""
