"""The core's control: a front end and the engines it dispatches to, one component each.

- :class:`~hdl.control.front_end.FrontEnd`: fetch, decode, error checks, dispatch, host
  transfers, status, in-band error beat and resynchronisation; its
  :class:`~hdl.control.checks.Checks` (the error checks) and
  :class:`~hdl.control.dispatch.Dispatch` (when an instruction issues);
- :class:`~hdl.control.hazards.HazardTracker`: the ranges of unfinished instructions and the
  rules that make a later instruction wait;
- :class:`~hdl.control.weight_loader.WeightLoader` (READ_WEIGHTS),
  :class:`~hdl.control.matrix_engine.MatrixEngine` (MATMUL),
  :class:`~hdl.control.activation_engine.ActivationEngine` (ACTIVATE, LOAD_PARAMS' store:
  :mod:`~hdl.control.param_store`),
  :class:`~hdl.control.host_writer.HostWriter` (WRITE_HOST and every beat to the host);
- :class:`~hdl.control.counters.PerfCounters`: TPU v1 Table 3 counters.
"""
