"""The job's configuration: the schema (``AppConfig``), reading and checking it, the engine keys. Pure: no Ray,
no torch.
"""
