"""Curation in the build (``curate``'s filters and decisions at their places in the build's passes), each
part only when the build asks for it (``BuildConfig.curate``; every filter is off by default):

    filters.py   the read pass's document filters (``read.DOC_FILTERS``: language, quality, decontamination, then
                 dedup's signatures) and what a unit commits for them (its report lines, its signatures); the
                 evaluation sets' index; the curation part of the build's identity; the job's start-time checks
    stage.py     the ``curate`` stage between the read pass and the pool: dedup's global decision and the ``--mix``
                 draw, as a drop list and a copies list per unit (``pipeline/drops.py``); the Ray side of the
                 decision is ``pipeline/ray_data/curate.py``
    reports.py   the ``reports`` stage (OUTPUT/reports/dropped.jsonl, edited.jsonl) and the manifest's ``curation``
"""
