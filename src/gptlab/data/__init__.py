"""From a text file to batches of token ids: corpus.py, tokenizer.py, datamodule.py."""
