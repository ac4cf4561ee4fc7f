"""collapse-doctor inside other tools' training loops.

``trl``       :class:`~collapse_doctor.integrations.trl.CollapseDoctorCallback` for a plain ``trl.GRPOTrainer``
              (needs the ``train`` extra), and :func:`~collapse_doctor.integrations.trl.attach`
``rollouts``  what a monitored run writes: canonical rollout parts, per-step scalars, the run's series
``live``      ``scan``'s detectors on the series of a run while it trains

``collapse-doctor retrain`` trains through the same callback.
"""
