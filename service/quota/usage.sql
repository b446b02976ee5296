-- Usage of a period (service/quota/usage.py): the counter while open, the ledger once closed.

-- name: usage_open
SELECT CASE WHEN period = %(period)s THEN used ELSE 0 END AS used, period
  FROM quotas
 WHERE account_id = %(account_id)s AND metric = %(metric)s

-- name: usage_from_ledger
-- A closed period's final `used`, recomputed from the ledger: takes minus releases after the
-- period's latest reset row (in chain order, seq). The same formula the reconciliation checks
-- counters against.
WITH rows AS (
    SELECT seq, kind, units FROM ledger
     WHERE account_id = %(account_id)s AND metric = %(metric)s AND period = %(period)s
), last_reset AS (
    SELECT coalesce(max(seq), 0) AS seq FROM rows WHERE kind = 'reset'
)
SELECT coalesce(sum(CASE kind WHEN 'take' THEN units WHEN 'release' THEN -units ELSE 0 END), 0)::bigint
       AS used
  FROM rows, last_reset
 WHERE rows.seq > last_reset.seq
