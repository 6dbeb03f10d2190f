"""The ``SingleControllerActor``: its pumps, its save coordination and its recovery.
"""
