"""Text: corpora, vocab files, tokenizers and preprocessors, sliding windows."""
