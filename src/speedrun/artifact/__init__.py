"""The artifact's code side: which source files a submission counts (artifact.py), the self-extracting
train_gpt.py that packs them (wrap.py), and the minified source it packs (minify.py)."""
