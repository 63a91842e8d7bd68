"""The CALM formats, byte for byte: the 320-id tokenizer and templates, CTDS datasets, CWGT v5 weights,
the training-source text, the coloured token view.
"""
