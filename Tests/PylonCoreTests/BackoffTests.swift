import PylonCore
import Testing

@Suite struct BackoffTests {
    @Test func doublesFromTheFirstAttemptAndStopsAtTheCap() {
        let p = BackoffPolicy(initialMs: 100, maxMs: 1_000)
        #expect((0...6).map { p.delay(attempt: $0) } == [100, 100, 200, 400, 800, 1_000, 1_000])
        #expect(p.delay(attempt: Int.max) == 1_000)
    }

    @Test func multiplierAndJitterStayWithinTheCap() {
        let p = BackoffPolicy(initialMs: 1_000, maxMs: 10_000, multiplier: 3, jitter: 0.2)
        #expect(p.delay(attempt: 2, random: 0.5) == 3_000)
        #expect(p.delay(attempt: 1, random: 0) == 800)
        #expect(p.delay(attempt: 1, random: 0.999_999) <= 1_200)
        #expect(p.delay(attempt: 9, random: 0.999_999) == 10_000)
    }

    @Test func statefulBackoffCountsAttemptsAndResets() {
        var b = Backoff(BackoffPolicy(initialMs: 10, maxMs: 80))
        #expect([b.next(), b.next(), b.next(), b.next(), b.next()] == [10, 20, 40, 80, 80])
        #expect(b.attempt == 5)
        b.reset()
        #expect(b.next() == 10)
    }

    @Test func jitteredDelaysStayAroundTheBase() {
        var b = Backoff(initialMs: 100, maxMs: 1000, jitter: 0.2, seed: 1)
        let delays = (0..<6).map { _ in b.next() }
        for (d, base) in zip(delays, [100, 200, 400, 800, 1000, 1000] as [UInt64]) {
            #expect(d >= base * 8 / 10 && d <= base * 12 / 10, "\(d) around \(base)")
        }
    }
}
