"""The GPT itself, free of Lightning: attention.py and gpt.py read top to bottom."""
