"""The soak's summaries and judgement, without running anything: what
grew between quiet figures, attach windows and thirds, its targets, its
report and chart.

    PYTHONPATH=bench python3 -m unittest discover -s bench/tests
"""
import unittest
import xml.etree.ElementTree as ElementTree

from linnet_bench import docs, report, soak


def quiet(daemon, phase, t, fds=40, rss_mib=15.0, nft_elements=24, nft_rules=71, links=6, leases=3):
    return {"t": t, "daemon": daemon, "phase": phase, "steady": True, "wait_s": 6.0, "fds": fds,
            "rss_mib": rss_mib, "nft_elements": nft_elements, "nft_rules": nft_rules, "links": links,
            "leases": leases, "interfaces": 3, "connections": 3, "relays": 1}


def attaches(count, t0, t1, ms, kind="tap"):
    step = (t1 - t0) / count
    return [{"t": t0 + i * step, "kind": kind, "ms": ms, "daemon": 1} for i in range(count)]


def figures(quiets, timed, failures=()):
    """A soak object as soak.summarize makes it, for a 2-minute plan."""
    extra = {"workers": 3, "lease_time_s": 6, "wall_s": 150, "ended_by_restart": 2,
             "calls_held_by_restarts": 1, "changes": {"forwards": 10, "policies": 12},
             "restart_figures": [{"t": 70, "churned_attached": 2, "churned_kinds": ["clone", "tap"],
                                  "stop_ms": 40.0, "serving_ms": 60.0, "reclaimed_ms": 65.0}],
             "traffic": [{"guest": "soak-tap", "network": "soak", "pings_sent": 600, "pings_received": 600,
                          "lease_renewals": 40}],
             "series": [{"t": t, "daemon": 1, "quiet": False, **{k: v for k, v in quiet(1, "", t).items()
                                                                  if k not in ("t", "daemon", "phase")}}
                        for t in range(0, 140, 10)]}
    return soak.summarize(soak.plan(2), quiets, timed, list(failures), extra)


def steady_quiets(**end):
    return [quiet(1, "start", 20), quiet(1, "end", 65), quiet(2, "start", 90), quiet(2, "end", 130, **end)]


class Plan(unittest.TestCase):
    def test_a_short_soak_still_restarts_once(self):
        p = soak.plan(0.5)
        self.assertEqual((p["lives"], p["life_s"]), (2, 15.0))
        self.assertLess(p["warmup_s"], p["life_s"])

    def test_a_whole_run_restarts_every_five_minutes(self):
        p = soak.plan(soak.MINUTES)
        self.assertEqual((p["lives"], p["life_s"], p["warmup_s"]), (6, 300.0, 60.0))
        self.assertEqual((p["sample_every_s"], p["window_s"]), (10.0, 60.0))


class Summaries(unittest.TestCase):
    def test_growth_is_end_minus_start_and_rss_a_ratio(self):
        g = soak.growth(quiet(1, "start", 0), quiet(2, "end", 9, fds=42, rss_mib=16.5, nft_elements=23))
        self.assertEqual((g["fd_growth"], g["nft_element_growth"], g["nft_rule_growth"]), (2, -1, 0))
        self.assertEqual(g["rss_growth_ratio"], 1.1)

    def test_each_daemon_is_measured_from_its_own_start(self):
        lives = soak.per_daemon(steady_quiets(fds=44))
        self.assertEqual([d["daemon"] for d in lives], [1, 2])
        self.assertEqual([d["fd_growth"] for d in lives], [0, 4])

    def test_attaches_per_window_and_by_thirds(self):
        timed = attaches(30, 0, 60, 5.0) + attaches(30, 60, 120, 9.0)
        windows = soak.windows(timed, 30)
        self.assertEqual([(w["t"], w["count"], w["p99"]) for w in windows],
                         [(0, 15, 5.0), (30, 15, 5.0), (60, 15, 9.0), (90, 15, 9.0)])
        thirds = soak.thirds(timed, since=0)
        self.assertEqual((thirds["first"]["p99"], thirds["last"]["p99"]), (5.0, 9.0))
        self.assertIsNone(soak.thirds(timed, since=90), "too few for a p99 in a third")

    def test_the_networks_socket_is_left_out_of_the_attach_series(self):
        s = figures(steady_quiets(), attaches(60, 20, 130, 5.0) + attaches(60, 20, 130, 50.0, "socket"))
        self.assertEqual(s["attach_ms"]["thirds"]["last"]["p99"], 5.0)
        self.assertEqual(s["attach_ms_by_kind"]["socket"]["p50"], 50.0)
        self.assertEqual(s["attaches"], 120)

    def test_metrics_and_nftables_are_counted(self):
        text = ('# HELP linnet_network_dhcp_leases x\nlinnet_network_dhcp_leases{network="soak"} 2\n'
                'linnet_network_dhcp_leases{network="shared"} 7\n'
                'linnet_network_dhcp_leases{network="soakhost"} 1\nlinnet_connections 3\n')
        self.assertEqual(soak.metric(text, "linnet_network_dhcp_leases", soak.NETWORKS), 3)
        self.assertEqual(soak.metric(text, "linnet_connections"), 3)
        ruleset = {"nftables": [{"metainfo": {}}, {"set": {"name": "a", "elem": ["x", "y"]}},
                                {"map": {"name": "b", "elem": [["k", "v"]]}}, {"set": {"name": "empty"}},
                                {"rule": {}}, {"rule": {}}]}
        self.assertEqual(soak.nft_counts(ruleset), (3, 2))


class Targets(unittest.TestCase):
    def statuses(self, s):
        return {t["target"]: t["status"] for t in report.soak_targets(s)}

    def test_a_steady_soak_meets_every_target(self):
        s = figures(steady_quiets(rss_mib=15.5), attaches(90, 20, 130, 6.0))
        self.assertEqual(set(self.statuses(s).values()), {"met"})

    def test_a_leak_each_restart_drops_is_caught_within_a_daemons_life(self):
        # Descriptors back at the soak's end, but daemon 1 grew 5 before its restart.
        quiets = [quiet(1, "start", 20), quiet(1, "end", 65, fds=45, rss_mib=17.0),
                  quiet(2, "start", 90), quiet(2, "end", 130)]
        found = {t["target"]: t for t in report.soak_targets(figures(quiets, attaches(90, 20, 130, 6.0)))}
        self.assertEqual(found["daemon descriptors, end vs start"]["status"], "met")
        worst = found["daemon descriptors over one daemon's life, the worst"]
        self.assertEqual((worst["measured"], worst["status"]), (5, "missed"))
        self.assertIn("daemon 1: 40 → 45", worst["detail"])
        self.assertEqual(found["daemon RSS over one daemon's life, the worst"]["status"], "missed")

    def test_nftables_elements_left_behind_are_missed(self):
        s = figures(steady_quiets(nft_elements=30), attaches(90, 20, 130, 6.0))
        self.assertEqual(self.statuses(s)["nftables elements, end vs start"], "missed")

    def test_attach_p99_growing_over_the_soak_is_missed(self):
        s = figures(steady_quiets(), attaches(45, 20, 75, 6.0) + attaches(45, 75, 130, 10.0))
        t = next(t for t in report.soak_targets(s) if t["target"].startswith("attach p99"))
        self.assertEqual((t["measured"], t["status"]), (1.67, "missed"))

    def test_too_few_attaches_leave_flatness_unjudged_and_failures_count(self):
        s = figures(steady_quiets(), attaches(10, 20, 130, 6.0), failures=["31 s: clone on soak: boom"])
        statuses = self.statuses(s)
        self.assertEqual(statuses["attach p99, the last third of the soak / the first"], "not measured")
        self.assertEqual(statuses["churn failures"], "missed")

    def test_a_failed_soak_has_no_targets_and_says_why(self):
        self.assertEqual(report.soak_targets({"error": "BenchError: no lease"}), [])
        self.assertEqual(report.soak_rows({"error": "BenchError: no lease"}), ["Not measured: BenchError: no lease."])


class Shown(unittest.TestCase):
    def results(self):
        r = {"format": docs.FORMAT, "throughput": [], "not_run": [], "control": None,
             "date": "2026-11-27 00:00 UTC", "settings": {"runs": 3, "seconds": 2}, "duration_s": 3000,
             "machine": {"linnet_commit": "abc1234", "cores": 2},
             "soak": figures(steady_quiets(fds=41), attaches(90, 20, 130, 6.0))}
        r["targets"] = report.targets(r)
        return r

    def test_the_docs_block_has_start_end_and_the_targets(self):
        text = docs.render("soak", self.results(), "docs/operations.md")
        self.assertIn("| daemon descriptors | 40 | 41 | +1 | +1 |", text)
        self.assertIn("- daemon descriptors, end vs start (goal <= 0 descriptors): +1 (40 → 41), **missed**.",
                      text)

    def test_the_chart_is_svg_with_a_panel_per_figure(self):
        chart = ElementTree.fromstring(report.soak_svg(self.results()))
        titles = [t.text for t in chart.iter("{http://www.w3.org/2000/svg}text")]
        for title in ("daemon descriptors", "daemon RSS, MiB", "nftables elements", "nftables rules"):
            self.assertIn(title, titles)


if __name__ == "__main__":
    unittest.main()
