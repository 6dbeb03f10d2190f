"""Weight sync: each weights version from the trainers to the generation workers, behind one seam.

* ``push.WeightSync`` — the control path, one for every transport: every trainer rank's ``get_weights`` (collective
  where the model is sharded), rank 0's result handed to each worker's ``set_weights`` as one Ray object; which
  version each worker holds. Set-up's first sync, the controller's per-step sync and a replacement worker's sync
  all call it.
* ``base.WeightTransport`` — how the bytes travel, one module per transport: ``object_store`` (the state dict is the
  object; CPU or GPU) and ``nccl`` (the object is a small offer, the bytes a broadcast from trainer rank 0's GPU;
  GPU only). A transport gives trainer ranks their sender (what ``get_weights`` returns) and a vLLM engine its
  receiver (how a payload lands in the engine's workers).
* ``factory.transport_for`` — the one place that chooses (the transport follows ``generation.engine``).

Set-up, the controller, the workers and the engines never branch on the transport. Importing this package imports
neither Ray nor torch.
"""
