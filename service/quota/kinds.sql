-- A metric whose kind or reset changed in the plan config (service/quota/kinds.py). A counter's
-- period says the kind it is counted as (service/quota/periods.py: its length).

-- name: kind_conflicts
-- Per metric: the live counters that hold usage in a period of another kind than the config's now
-- (`widths`: the length of each metric's period). One pass over quotas, by a filter alone (no join),
-- which Citus runs on every shard.
SELECT metric, count(*) AS counters, sum(used)::bigint AS used
  FROM quotas
 WHERE metric = ANY(%(metrics)s) AND used > 0 AND NOT account_deleted
   AND char_length(period) <> (%(widths)s::int[])[array_position(%(metrics)s::text[], metric::text)]
 GROUP BY metric
 ORDER BY metric

-- name: kind_converts
-- The next counters of `metric` after `after` (account order) counted as another kind than the
-- config's, whatever they hold.
SELECT account_id
  FROM quotas
 WHERE metric = %(metric)s AND account_id > %(after)s AND char_length(period) <> %(width)s
 ORDER BY account_id
 LIMIT %(batch_size)s
