-- What /metrics reads from the database at scrape time (service/http/gauges.py): a few index
-- lookups, under a short statement timeout.

-- name: gauges_attention_oldest
-- The oldest event of each status support must look at, by the webhook_events_attention index
-- (status, id); no row: no such event.
SELECT s.status, extract(epoch FROM statement_timestamp() - e.received_at)::float8 AS age_seconds
  FROM unnest(%(statuses)s::text[]) AS s(status)
  JOIN LATERAL (SELECT received_at FROM webhook_events w
                 WHERE w.status = s.status ORDER BY w.id LIMIT 1) e ON true

-- name: gauges_job_runs
-- Each job's latest run (its progress, if still running) and its latest finished one, by the
-- (job, period) primary key; a job that never ran has a row of NULLs.
SELECT j.job,
       latest.period AS latest_period, latest.status = 'running' AS running, latest.batches,
       latest.counters_reset,
       extract(epoch FROM statement_timestamp() - latest.updated_at)::float8 AS since_progress,
       done.period AS done_period, extract(epoch FROM done.finished_at)::float8 AS done_at
  FROM unnest(%(jobs)s::text[]) AS j(job)
  LEFT JOIN LATERAL (SELECT period, status, batches, counters_reset, updated_at FROM job_runs r
                      WHERE r.job = j.job ORDER BY r.period DESC LIMIT 1) latest ON true
  LEFT JOIN LATERAL (SELECT period, finished_at FROM job_runs r
                      WHERE r.job = j.job AND r.status = 'done' ORDER BY r.period DESC LIMIT 1) done ON true
