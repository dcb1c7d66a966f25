import Glibc
import PylonProtocol
import Testing

@testable import PylonHost

/// Restart policy, backoff, intensity and decay of the supervisor state machine, driven by a fake
/// clock: no processes, no sleeps. (Each transition's actions: PluginLifecycleTransitionTests.)
struct SupervisorTests {
    typealias Action = PluginLifecycle.Action

    func policy(_ f: (inout SupervisorPolicy) -> Void = { _ in }) -> SupervisorPolicy {
        var p = SupervisorPolicy()
        p.backoffInitialMs = 100
        p.backoffMaxMs = 1_000
        p.jitter = 0
        p.maxRestarts = 3
        p.intensityWindowMs = 10_000
        p.resetAfterMs = 5_000
        f(&p)
        return p
    }

    /// Runs a plugin to `running` at `now`.
    func started(_ p: SupervisorPolicy, now: UInt64 = 0) -> PluginLifecycle {
        var l = PluginLifecycle(policy: p)
        #expect(l.start(now: now) == [.spawn])
        _ = l.spawned(pid: 42, now: now)
        #expect(l.state == .starting)
        _ = l.handshakeCompleted(now: now)
        #expect(l.state == .running)
        return l
    }

    /// The restart delay a list of actions schedules, if it schedules one.
    func restartDelay(_ actions: [Action]) -> UInt64? {
        for case .publishExited(_, _, let ms?) in actions { return ms }
        return nil
    }

    /// The failure a list of actions announces, if it announces one.
    func failure(_ actions: [Action]) -> String? {
        for case .publishExited(_, let reason, nil) in actions { return reason }
        return nil
    }

    /// The backoff ran out: spawned again and handshaken at `now`.
    func respawn(_ l: inout PluginLifecycle, now: UInt64) {
        #expect(l.timerFired(.backoff, now: now).last == .spawn)
        _ = l.spawned(pid: 43, now: now)
        _ = l.handshakeCompleted(now: now)
    }

    @Test func crashSchedulesRestartWithExponentialBackoff() {
        var l = started(policy())
        var now: UInt64 = 1
        var delays: [UInt64] = []
        for _ in 0..<3 {
            guard let d = restartDelay(l.exited(now: now, status: 1, signal: 0)) else {
                Issue.record("expected a restart"); return
            }
            delays.append(d)
            #expect(l.state == .backoff)
            now += d
            respawn(&l, now: now)
            now += 1
        }
        #expect(delays == [100, 200, 400])
        #expect(l.restarts == 3)
    }

    @Test func backoffIsCapped() {
        var l = PluginLifecycle(policy: policy())
        let d = [1, 4, 5, 30].map { l.backoffDelay(failures: $0) }
        #expect(d == [100, 800, 1_000, 1_000])
    }

    @Test func jitterStaysWithinBounds() {
        var l = PluginLifecycle(
            policy: policy {
                $0.jitter = 0.25; $0.backoffMaxMs = 100_000
            }, seed: 42)
        var seen = Set<UInt64>()
        for _ in 0..<500 {
            let d = l.backoffDelay(failures: 3)  // base 400
            #expect(d >= 300 && d <= 500)
            seen.insert(d)
        }
        #expect(seen.count > 20, "jitter should spread delays")
    }

    @Test func jitterNeverExceedsCap() {
        var l = PluginLifecycle(policy: policy { $0.jitter = 0.5 }, seed: 7)
        for _ in 0..<200 { #expect(l.backoffDelay(failures: 10) <= 1_000) }
    }

    @Test func intensityLimitMarksFailed() {
        var l = started(policy())
        var now: UInt64 = 10
        for _ in 0..<3 {
            guard let d = restartDelay(l.exited(now: now, status: 0, signal: 9)) else {
                Issue.record("expected a restart"); return
            }
            now += d
            respawn(&l, now: now)
            now += 10
        }
        guard let reason = failure(l.exited(now: now, status: 0, signal: 9)) else {
            Issue.record("expected failed"); return
        }
        #expect(reason.contains("intensity"))
        #expect(l.state == .failed)
        #expect(l.failedReason == reason)
        #expect(l.timerFired(.backoff, now: now + 100_000) == [], "a failed plugin is not restarted by itself")
    }

    @Test func restartsOutsideTheWindowDoNotCount() {
        var l = started(
            policy {
                $0.intensityWindowMs = 1_000; $0.resetAfterMs = 1_000_000
            })
        var now: UInt64 = 0
        for _ in 0..<10 {
            now += 2_000  // each crash more than a window after the previous restart
            guard let d = restartDelay(l.exited(now: now, status: 1, signal: 0)) else {
                Issue.record("expected a restart"); return
            }
            now += d
            respawn(&l, now: now)
        }
        #expect(l.state == .running)
    }

    @Test func healthyUptimeResetsBackoff() {
        var l = started(policy())
        guard let d1 = restartDelay(l.exited(now: 10, status: 1, signal: 0)) else { Issue.record("restart"); return }
        respawn(&l, now: 10 + d1)
        guard let d2 = restartDelay(l.exited(now: 20 + d1, status: 1, signal: 0)) else { Issue.record("restart"); return }
        #expect(d2 == 200)
        let t = 20 + d1 + d2
        respawn(&l, now: t)
        // Healthy for longer than resetAfterMs: the next crash starts the backoff afresh.
        guard let d3 = restartDelay(l.exited(now: t + 6_000, status: 1, signal: 0)) else { Issue.record("restart"); return }
        #expect(d3 == 100)
        #expect(l.consecutiveFailures == 1)
    }

    @Test func transientRestartsOnlyAfterAbnormalExit() {
        var l = started(policy { $0.restart = .transient })
        #expect(l.exited(now: 5, status: 0, signal: 0) == [.cancelTimer(.heartbeat)])
        #expect(l.state == .stopped)
        var l2 = started(policy { $0.restart = .transient })
        #expect(restartDelay(l2.exited(now: 5, status: 3, signal: 0)) != nil)
    }

    @Test func temporaryIsNeverRestarted() {
        var l = started(policy { $0.restart = .temporary })
        #expect(failure(l.exited(now: 5, status: 1, signal: 0)) != nil)
        #expect(l.state == .failed)
        var l2 = started(policy { $0.restart = .temporary })
        #expect(l2.exited(now: 5, status: 0, signal: 0) == [.cancelTimer(.heartbeat)])
        #expect(l2.state == .stopped)
    }

    @Test func permanentRestartsEvenAfterCleanExit() {
        var l = started(policy())
        #expect(restartDelay(l.exited(now: 5, status: 0, signal: 0)) == 100)
    }

    @Test func exitStatus78IsAPermanentFailure() {
        var l = started(policy())
        let r = failure(l.exited(now: 5, status: Int64(exitStatusConfigError), signal: 0))
        #expect(r?.contains("78") == true)
        #expect(l.state == .failed)
    }

    @Test func missedHeartbeatKillsThenRestarts() {
        var l = started(policy())
        _ = l.timerFired(.heartbeat, now: 5_000)  // sends the heartbeat
        #expect(l.timerFired(.heartbeat, now: 15_000).contains(.signal(SIGKILL, .hung(waitedMs: 10_000))))
        #expect(restartDelay(l.exited(now: 15_001, status: 0, signal: 9)) != nil)
        #expect(l.lastExitReason?.contains("heartbeat") == true)
    }

    @Test func missedHandshakeKillsThenRestarts() {
        var l = PluginLifecycle(policy: policy())
        _ = l.start(now: 0)
        _ = l.spawned(pid: 42, now: 0)
        #expect(l.timerFired(.handshake, now: 10_000).contains(.signal(SIGKILL, .noHandshake(timeoutMs: 10_000))))
        #expect(restartDelay(l.exited(now: 10_001, status: 0, signal: 9)) != nil)
        #expect(l.lastExitReason == "no handshake within 10000 ms")
    }

    @Test func heartbeatIgnoredWhenNotRunning() {
        var l = PluginLifecycle(policy: policy())
        #expect(l.timerFired(.heartbeat, now: 1) == [])
    }

    @Test func requestedStopEndsStoppedWithoutRestart() {
        var l = started(policy())
        #expect(l.stop(now: 1).contains(.sendShutdown))
        #expect(l.exited(now: 2, status: 0, signal: 15) == [.cancelTimer(.stop)])
        #expect(l.state == .stopped)
    }

    @Test func manualStartClearsFailed() {
        var l = started(policy { $0.restart = .temporary })
        _ = l.exited(now: 1, status: 1, signal: 0)
        #expect(l.state == .failed)
        #expect(l.start(now: 2) == [.spawn])
        #expect(l.state == .starting)
        #expect(l.failedReason == nil)
    }

    @Test func manualRestartDoesNotSpendTheBudget() {
        var l = started(policy { $0.maxRestarts = 1 })
        for i in 0..<5 {
            let t = UInt64(i * 10)
            #expect(l.restartRequested(now: t) == [.cancelTimer(.heartbeat), .signal(SIGKILL, .restartRequested)])
            #expect(l.exited(now: t + 1, status: 0, signal: 9) == [.spawn])
            _ = l.spawned(pid: 50 + Int32(i), now: t + 1)
            _ = l.handshakeCompleted(now: t + 2)
        }
        #expect(l.state == .running)
        #expect(l.restarts == 5)
        #expect(l.recentRestarts.isEmpty)
        // The automatic budget is still whole: one crash is restarted.
        #expect(restartDelay(l.exited(now: 100, status: 1, signal: 0)) != nil)
    }

    @Test func spawnFailureBacksOff() {
        var l = PluginLifecycle(policy: policy())
        _ = l.start(now: 0)
        let actions = l.spawnFailed(now: 1, error: "ENOENT")
        #expect(restartDelay(actions) != nil)
        #expect(actions.contains(.publishExited(pid: 0, reason: "spawn failed: ENOENT", restartInMs: 100)))
        #expect(l.lastExitReason?.contains("ENOENT") == true)
    }
}
