"""Weight sync: each weights version from the trainers to the generation workers, behind one seam.

``push.WeightSync`` is the control path: every trainer rank's ``get_weights`` (collective where the model is
sharded), rank 0's result handed to each worker's ``set_weights`` as one Ray object; which version each worker
holds. Set-up's first sync, the controller's per-step sync and a replacement worker's sync all call it. Importing
this package imports neither Ray nor torch.
"""
