"""One attempt of the job: the entry ``run_job``, set-up in the seed's restore order, the poll loop, the
in-job restore, the watch over the job's actors and the cluster-fit check.
"""
