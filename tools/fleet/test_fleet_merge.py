#!/usr/bin/env python3
"""Tests of tools/fleet/fleet_merge.py (python3 stdlib unittest; run by make fleet-test):
how a run is shared out over pylon-fleet processes and how their summaries become one."""
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fleet_merge import fleet_opt, histogram_percentile, merge_outages, merge_summaries, shards  # noqa: E402


def bucket(us):
    """pylon-fleet's LatencyHistogram.bucket: 0 holds 0 and 1 µs, bucket i holds (1.04^(i-1), 1.04^i]."""
    import math
    return 0 if us <= 1 else math.ceil(math.log(us) / math.log(1.04))


def part(name, first, devices, *, acked, lost, expected, delivered, hist, sends, outages=(), code=0, ready=30.0,
         foreign=0, processes=None):
    lat = {k: {"sends": sends.get(k, 0), "deliveries": sum(c for _, c in hist.get(k, [])), "p50Ms": None, "p99Ms": None,
               "maxMs": None, "histogram": hist.get(k, []), "maxUs": max([us for us in hist.get(k + "MaxUs", [0])])}
           for k in ("device", "user", "broadcast")}
    return {"runId": "r1", "name": name, "firstDevice": first, "devices": devices, "ratePerDevice": 1.0,
            "durationS": 100.0, "loadS": 60.0, "connected": devices, "registered": devices,
            "allConnectedAfterS": ready, "fdLimit": None, "setupFailures": 1,
            "events": {"generated": acked + 5, "acked": acked, "unacked": 5, "rejected": 0, "throttled": 0,
                       "storedRead": acked, "lost": lost, "duplicates": 0, "foreign": foreign, "peer": 7,
                       "ackedPerS": 10.0, "peakAckedPerS": 20.0, "peakStoredPerS": 40.0, "batchesPosted": 3,
                       "batchesFailed": 1},
            "push": {"expected": expected, "delivered": delivered, "lost": expected - delivered, "appDuplicates": 0,
                     "redeliveredDropped": 2, "malformed": 0, "foreign": 0, "peerBroadcasts": 1, "latency": lat},
            "mqtt": {"connects": devices, "lostOrRefused": 0, "brokerMoves": 0},
            "outages": list(outages), "httpErrors": {"HTTP 503": 2}, "processes": processes or [],
            "verifyError": None, "exitCode": code}


class SharesTests(unittest.TestCase):
    def test_as_few_processes_as_the_bound_allows_in_whole_users(self):
        self.assertEqual(shards(10000, 5000, 2), [(0, 5000), (5000, 5000)])
        self.assertEqual(shards(50, 5000, 2), [(0, 50)])
        self.assertEqual(shards(10001, 5000, 2), [(0, 3334), (3334, 3334), (6668, 3333)])
        for total, per, unit in ((10000, 3000, 3), (7, 2, 2), (20000, 6560, 2)):
            s = shards(total, per, unit)
            self.assertEqual(sum(k for _, k in s), total)
            self.assertEqual([f for f, _ in s], [sum(k for _, k in s[:i]) for i in range(len(s))])  # contiguous
            self.assertTrue(all(k % unit == 0 for _, k in s[:-1]))  # a user's devices in one process
            self.assertLessEqual(max(k for _, k in s), max(per, unit))

    def test_the_last_value_of_an_option_wins(self):
        argv = ["--ramp", "500", "--push-every", "2", "--ramp", "300"]
        self.assertEqual(fleet_opt(argv, "--ramp", 200), "300")
        self.assertEqual(fleet_opt(argv, "--devices-per-user", 2), 2)


class MergeTests(unittest.TestCase):
    def test_percentiles_come_from_the_merged_histograms(self):
        # 98 deliveries at 1 ms in one process, 2 at 5 s in the other: the p99 is the slow pair's.
        fast, slow = [[bucket(1000), 98]], [[bucket(5_000_000), 2]]
        a = part("pylon-fleet1", 0, 2, acked=10, lost=0, expected=100, delivered=100, sends={"broadcast": 1},
                 hist={"broadcast": fast, "broadcastMaxUs": [1000]})
        b = part("pylon-fleet2", 2, 2, acked=12, lost=0, expected=2, delivered=2, sends={"broadcast": 1},
                 hist={"broadcast": slow, "broadcastMaxUs": [5_000_000]})
        m = merge_summaries([a, b])
        lat = m["push"]["latency"]["broadcast"]
        self.assertEqual(lat["deliveries"], 100)
        self.assertEqual(lat["sends"], 1)  # each process counts the one broadcast: not two sends
        self.assertLessEqual(lat["p50Ms"], 1.0)
        self.assertAlmostEqual(lat["p99Ms"], 5000.0, delta=5000 * 0.04)
        self.assertEqual(lat["maxMs"], 5000.0)
        self.assertIsNone(histogram_percentile([], 0, 50))

    def test_counts_add_stream_wide_figures_count_once_and_the_worst_status_wins(self):
        a = part("pylon-fleet1", 0, 5000, acked=100, lost=0, expected=10, delivered=10, sends={"device": 3},
                 hist={}, foreign=4, processes=[{"name": "pylon-fleet1"}, {"name": "pylon-fleet2"}])
        b = part("pylon-fleet2", 5000, 5000, acked=200, lost=1, expected=20, delivered=19, sends={"device": 4},
                 hist={}, foreign=4, code=1, ready=None)
        m = merge_summaries([a, b])
        self.assertEqual(m["devices"], 10000)
        self.assertEqual(m["events"]["acked"], 300)
        self.assertEqual(m["events"]["lost"], 1)
        self.assertEqual(m["events"]["foreign"], 4)  # both read the same stream
        self.assertEqual(m["events"]["peakStoredPerS"], 40.0)
        self.assertNotIn("peer", m["events"])
        self.assertEqual((m["push"]["expected"], m["push"]["delivered"], m["push"]["lost"]), (30, 29, 1))
        self.assertEqual(m["push"]["latency"]["device"]["sends"], 7)
        self.assertEqual(m["httpErrors"], {"HTTP 503": 4})
        self.assertIsNone(m["allConnectedAfterS"])  # one process never had all its devices
        self.assertEqual(m["exitCode"], 1)
        self.assertEqual([p["name"] for p in m["processes"]], ["pylon-fleet1", "pylon-fleet2"])
        self.assertEqual([p["firstDevice"] for p in m["fleetProcesses"]], [0, 5000])
        self.assertIs(merge_summaries([a]), a)

    def test_an_unknown_loss_in_one_process_is_unknown_for_the_run(self):
        a = part("pylon-fleet1", 0, 2, acked=1, lost=0, expected=0, delivered=0, sends={}, hist={})
        b = part("pylon-fleet2", 2, 2, acked=1, lost=None, expected=0, delivered=0, sends={}, hist={}, code=3)
        m = merge_summaries([a, b])
        self.assertIsNone(m["events"]["lost"])
        self.assertEqual(m["exitCode"], 3)

    def test_overlapping_outages_are_one(self):
        a = part("pylon-fleet1", 0, 100, acked=0, lost=0, expected=0, delivered=0, sends={}, hist={},
                 outages=[{"atS": 10.0, "lowest": 0, "reconnectedAfterS": 8.0},
                          {"atS": 50.0, "lowest": 90, "reconnectedAfterS": None}])
        b = part("pylon-fleet2", 100, 100, acked=0, lost=0, expected=0, delivered=0, sends={}, hist={},
                 outages=[{"atS": 10.2, "lowest": 5, "reconnectedAfterS": 9.0}])
        o = merge_outages([a, b])
        self.assertEqual(o[0], {"atS": 10.0, "lowest": 5, "reconnectedAfterS": 9.2})
        # The second is process 1's alone: process 2's devices count as connected.
        self.assertEqual(o[1], {"atS": 50.0, "lowest": 190, "reconnectedAfterS": None})
        self.assertEqual(len(o), 2)


if __name__ == "__main__":
    unittest.main()
