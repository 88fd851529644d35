"""`rethink-mn export`: the rooms of the node as a Parquet dataset for the analytics."""
