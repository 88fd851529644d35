"""Traffic analytics of the Message Node: room-event export in, aggregates and a dashboard out.

    export (docs/export-schema.md) --job.py (PySpark)--> Parquet aggregates + summary.json
    new export rows --increments.py (PySpark)--> per-minute partials
                    --window.py (pyarrow)--> the same aggregates, for the live window
    aggregates --panels.py (pyarrow)--> the dashboard's figures
               --dashboard.py--> a page drawn by plotly.js (live or a file)

Modules, one job each:

* `schema`       the export's two datasets: one column list, Arrow schemas (no Spark import: the
                 export writes with it)
* `spark_schema` the same datasets as Spark schemas, for the job
* `inventory`    lists and checks the export's files on the driver (what is read, what skipped)
* `aggregates`   the aggregates as DataFrame transformations; their definitions are in its doc
* `names`        names of the outputs (no Spark import: the dashboard uses it)
* `output`       writes the small aggregates and summary.json
* `job`          `build_spark`, `run_analysis` and the command line / spark-submit entry
* `increments`   the live dashboard's Spark job: one cycle's new rows as per-minute partials
* `window`       sums a window's partials into the job's aggregates (no Spark)
* `panels`       the dashboard's figures (Plotly specs) and numbers, from the aggregates
* `dashboard`    the dashboard page: live (served by the node) or one self-contained file

Synthetic exports with known answers, for the tests and the benchmark, are in
tests/support/synthetic/.

Nothing is imported here, so the dashboard can be used without loading Spark.
"""
