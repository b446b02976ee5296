"""Celery app, beat schedule and thin tasks over service/ functions."""
