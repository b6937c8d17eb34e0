"""After-the-fact pictures of a guard report: one lane per rank as a self-contained HTML page
(inline SVG) or PNG, and a Chrome trace for Perfetto. Nothing here runs inside a training job;
the live watchdog (`ddpguard.guard`) only writes the JSON report these read."""
