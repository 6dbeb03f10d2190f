"""The remote tier: bundles on S3-compatible object storage with the local tier's guarantees
(``docs/object-storage.md``).

``probe.open_bucket`` checks the bucket at start-up (one line, exit 2, before Ray); ``fence.acquire`` takes it for an
attempt (the bucket's fencing record, ``record.py``); ``uploader.Uploader`` uploads and publishes committed bundles
behind training (``upload.upload_bundle``); ``bundles.check`` / ``bundles.download`` judge and bring home what is
there. ``store.Store`` is the only module that speaks S3 (boto3).
"""
