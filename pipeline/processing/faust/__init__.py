"""The Kafka runtime: a faust-streaming app as the source of the one write pipeline.

:mod:`.worker` (:class:`~runwire.processing.faust.worker.FaustWorker`) hands each
batch faust's consumer fetched to the stages and the write pipeline every runtime
shares (:mod:`runwire.processing.stages`, :mod:`runwire.processing.writes`);
:mod:`.partitions` tracks what each ingest partition has had processed (holes,
lost tails, a broker that lost its state); :mod:`.setup` builds the app;
:mod:`.seam` is all that touches faust's private internals. Needs the ``kafka``
extra; nothing here is imported by ``runwire.processing`` itself.
"""
