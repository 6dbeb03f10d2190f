"""Files: reading files someone else may change, durable writes, digests, strict JSON, torch files and the
low-priority writer threads. Pure but for ``torch_files`` (torch, imported by its users only).
"""
