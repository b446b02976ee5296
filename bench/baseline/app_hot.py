"""The baseline app with every take on one account (hot row): app.py's `/take` route, but running
take_hot.sql. Same pool, same Flask, same gunicorn settings; for the hot-row HTTP comparison.

Run: DATABASE_URL=... gunicorn -w 4 -b 127.0.0.1:8099 app_hot:app
"""
import os

from flask import jsonify

import app as base

app = base.app
TAKE_HOT = open(os.path.join(os.path.dirname(__file__), "take_hot.sql")).read().split("\n", 1)[1]


@app.post("/take_hot")
def take_hot():
    with base.pool.connection() as conn:
        conn.execute(TAKE_HOT)
    return jsonify(granted=True)
