-- The plan thresholds the takes read when they reach their alert line (service/quota/alerts.py,
-- quota_alert in migrations/repeatable/events_out.sql).

-- name: thresholds_set
-- Each plan's thresholds, as the plan file gives them (text array literals, one per plan).
INSERT INTO plan_thresholds (plan, thresholds)
SELECT p.plan, p.thresholds::smallint[]
  FROM unnest(%(plans)s::text[], %(thresholds)s::text[]) AS p (plan, thresholds)
    ON CONFLICT (plan) DO UPDATE SET thresholds = excluded.thresholds
 WHERE plan_thresholds.thresholds IS DISTINCT FROM excluded.thresholds

-- name: thresholds_drop
-- A plan the file no longer lists has no thresholds (an account still on it fires nothing).
DELETE FROM plan_thresholds WHERE plan <> ALL (%(plans)s::text[])
