"""The CALM model: the Mamba language model, its selective scans (the fused C++ kernel), weight files
to models, generation.
"""
