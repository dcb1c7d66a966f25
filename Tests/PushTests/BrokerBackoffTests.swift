import PylonMQTT
import PylonPluginKit
import Testing

@testable import pylon_push

/// The push plugin's broker reconnect backoff (`ReconnectBackoff` with the push defaults):
/// pure, the time passed in; no processes, no sleeps.
struct BrokerBackoffTests {
    /// The push plugin's options for an empty `broker` entry.
    var options: MQTTOptions { PushConfig().brokerOptions(clientId: "pylon-push-test") }

    func schedule(jitter: Double? = nil, _ o: MQTTOptions? = nil) -> ReconnectBackoff {
        let o = o ?? options
        return ReconnectBackoff(
            initialMs: o.backoffInitialMs, maxMs: o.backoffMaxMs, jitter: jitter ?? o.backoffJitter, stableMs: UInt64(o.keepaliveS) * 1000)
    }

    @Test func theCeilingIsAtLeastAMinuteByDefaultAndConfigurable() throws {
        #expect(options.backoffMaxMs == PushConfig.defaultBrokerBackoffMaxMs)
        #expect(options.backoffMaxMs >= 60_000)
        let set = try PushConfig(["broker": ["backoffMaxMs": 5_000, "backoffInitialMs": 100]])
        let o = set.brokerOptions(clientId: "c")
        #expect(o.backoffMaxMs == 5_000)
        #expect(o.backoffInitialMs == 100)
    }

    @Test func waitsDoubleToTheCeilingAndStayThereWhileTheBrokerStaysAway() {
        var s = schedule(jitter: 0)
        let delays = (0..<14).map { _ in s.nextDelayMs() }
        #expect(Array(delays.prefix(10)) == [250, 500, 1_000, 2_000, 4_000, 8_000, 16_000, 32_000, 64_000, 120_000])
        #expect(delays.suffix(4).allSatisfy { $0 == 120_000 })
        #expect(s.attempt == 14)
    }

    @Test func withJitterEveryWaitStaysUnderTheCeilingAndNearItOnceThere() {
        var s = schedule()
        let delays = (0..<200).map { _ in s.nextDelayMs() }
        #expect(delays.allSatisfy { $0 <= 120_000 && $0 >= 1 })
        #expect(delays.dropFirst(12).allSatisfy { $0 >= 96_000 }, "±20 % of the ceiling: \(delays.dropFirst(12).min() ?? 0)")
    }

    /// The attempts' own wake-ups while the broker is unreachable: past the first few minutes
    /// at most one attempt per 96 s (the ceiling less its jitter), under 0.011 per second.
    @Test func anUnreachableBrokerCostsFewAttemptsAnHour() {
        var s = schedule()
        var t: UInt64 = 0
        var attempts: [UInt64] = []
        while t < 3_600_000 {
            t += s.nextDelayMs()
            attempts.append(t)
        }
        let late = attempts.filter { $0 >= 600_000 }
        #expect(late.count <= 3_000_000 / 96_000 + 1)
        #expect(attempts.count < 60, "\(attempts.count) attempts in an hour")
    }

    @Test func aConnectionThatLastedStartsTheSequenceOver() {
        var s = schedule(jitter: 0)
        for _ in 0..<12 { _ = s.nextDelayMs() }
        #expect(s.nextDelayMs() == 120_000)
        s.connected(nowMs: 1_000_000)
        s.lost(nowMs: 1_000_000 + s.stableMs)
        #expect(s.nextDelayMs() == 250, "back to the first wait")
        #expect(s.nextDelayMs() == 500)
    }

    @Test func aConnectionDroppedAtOnceDoesNotResetIt() {
        var s = schedule(jitter: 0)
        for _ in 0..<5 { _ = s.nextDelayMs() }
        s.connected(nowMs: 50_000)
        s.lost(nowMs: 50_000 + s.stableMs - 1)
        #expect(s.nextDelayMs() == 8_000, "the sequence goes on")
        // Lost without having connected (a refused attempt): no reset either.
        s.lost(nowMs: 10_000_000)
        #expect(s.nextDelayMs() == 16_000)
    }
}
