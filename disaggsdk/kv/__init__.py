"""The KV page in one home: who holds which page, which pages a prompt can share, how a page is laid
out, and the memory each rank's pool lives in.
"""
