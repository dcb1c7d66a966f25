import PylonCore
import Testing

@testable import pylon_fleet

/// The pure parts of pylon-fleet: latency percentiles, rate pacing, the ramp, the ledgers that
/// decide "lost" and "duplicate", outage tracking, /proc parsing, options.
struct LatencyHistogramTests {
    @Test func percentilesOfAUniformSpreadAreWithinOneBucket() {
        var h = LatencyHistogram()
        for us in 1...10_000 { h.record(micros: UInt64(us) * 100) }  // 0.1 ms ... 1 s
        #expect(h.count == 10_000)
        let p50 = h.percentile(50)!, p99 = h.percentile(99)!
        #expect(abs(p50 - 500_000) / 500_000 <= LatencyHistogram.growth - 1)
        #expect(abs(p99 - 990_000) / 990_000 <= LatencyHistogram.growth - 1)
        #expect(p50 >= 500_000)  // a bucket's upper bound: never below the exact value
        #expect(h.percentile(100)! == 1_000_000)  // capped at the largest value seen
    }

    @Test func emptyHasNoPercentileAndOneValueIsItself() {
        var h = LatencyHistogram()
        #expect(h.percentile(50) == nil)
        h.record(micros: 12_345)
        #expect(h.percentile(1) == 12_345)
        #expect(h.percentile(99) == 12_345)
    }

    @Test func tailIsNotHiddenByTheMass() {
        var h = LatencyHistogram()
        for _ in 0..<98 { h.record(micros: 1000) }
        h.record(micros: 5_000_000)
        h.record(micros: 5_000_000)
        #expect(h.percentile(50)! < 1100)
        #expect(h.percentile(99)! >= 5_000_000 * 0.96)
    }

    @Test func mergeAddsCounts() {
        var a = LatencyHistogram(), b = LatencyHistogram()
        a.record(micros: 10)
        b.record(micros: 1_000_000)
        a.merge(b)
        #expect(a.count == 2)
        #expect(a.percentile(100) == 1_000_000)
        #expect(LatencyHistogram.bucket(0) == 0 && LatencyHistogram.bucket(UInt64.max) == LatencyHistogram.bucketCount - 1)
    }

    @Test func sparseBucketsAreWhatAMergerNeeds() {
        var h = LatencyHistogram()
        #expect(h.sparse.arrayValue?.isEmpty == true)
        h.record(micros: 1000)
        h.record(micros: 1000)
        h.record(micros: 2_000_000)
        let pairs = h.sparse.arrayValue ?? []
        #expect(pairs.count == 2)
        #expect(pairs.first?.arrayValue?.map(\.intValue) == [Int64(LatencyHistogram.bucket(1000)), 2])
        #expect(pairs.last?.arrayValue?.map(\.intValue) == [Int64(LatencyHistogram.bucket(2_000_000)), 1])
    }
}

struct PacingTests {
    @Test func fractionalRateDoesNotDrift() {
        var p = RatePacer(ratePerSecond: 2.5, startMs: 1000)
        var total: Int64 = 0
        for t in stride(from: 1000, through: 61_000, by: 100) { total += p.due(nowMs: Int64(t)) }
        #expect(total == 150)  // 60 s × 2.5
    }

    @Test func lateTickCatchesUpAndTimeBeforeStartGivesNothing() {
        var p = RatePacer(ratePerSecond: 10, startMs: 5000)
        #expect(p.due(nowMs: 4000) == 0)
        #expect(p.due(nowMs: 6000) == 10)
        #expect(p.due(nowMs: 6000) == 0)
        #expect(p.due(nowMs: 9000) == 30)
    }

    @Test func rampStartsAtMostItsRate() {
        var r = Ramp(perSecond: 100, startMs: 0)
        #expect(r.take(nowMs: 0, remaining: 1000) == 1)
        #expect(r.take(nowMs: 500, remaining: 1000) == 50)
        #expect(r.take(nowMs: 10_000, remaining: 20) == 20)  // bounded by what is left
        #expect(r.started == 71)
    }
}

struct LedgerTests {
    @Test func fifoKeepsOrderAcrossReclaiming() {
        var q = FIFO<Int>()
        #expect(q.pop() == nil)
        for i in 0..<3000 { q.push(i) }
        var out: [Int] = []
        for _ in 0..<2000 { out.append(q.pop()!) }
        for i in 3000..<3500 { q.push(i) }
        #expect(q.count == 1500)
        while let x = q.pop() { out.append(x) }
        #expect(out == Array(0..<3500))
        #expect(q.count == 0)
    }

    @Test func rangesMergeInAnyOrder() {
        var s = RangeSet()
        s.insert(0..<10)
        s.insert(10..<20)
        #expect(s.ranges == [0..<20])
        s.insert(30..<40)
        s.insert(20..<30)
        #expect(s.ranges == [0..<40])
        s.insert(50..<60)
        s.insert(45..<52)
        #expect(s.ranges == [0..<40, 45..<60])
        #expect(s.count == 55)
        #expect(s.contains(39) && !s.contains(40) && s.contains(45) && !s.contains(60))
    }

    @Test func lostAndDuplicateAreCountedPerAcknowledgedEvent() {
        var t = StoredTally(devices: 2)
        var acked = RangeSet()
        acked.insert(0..<100)
        for q in 0..<100 where q != 42 { t.add(id: Substring(StoredTally.recordId(runId: "r1", device: 1, seq: Int64(q))), runId: "r1") }
        t.add(id: "r1.1.7", runId: "r1")
        t.add(id: "r0.1.8", runId: "r1")  // another run's
        t.add(id: "r1.9.8", runId: "r1")  // another process's device
        t.add(id: "garbage", runId: "r1")
        #expect(t.lost(device: 1, acked: acked) == 1)
        #expect(t.lost(device: 0, acked: RangeSet()) == 0)
        #expect(t.duplicates == 1)
        #expect(t.read == 99)
        #expect(t.foreign == 2)
        #expect(t.peer == 1)
    }

    @Test func aShareOfTheRunCountsItsOwnDevicesByGlobalIndex() {
        // This process simulates devices 100 and 101 of the run.
        var t = StoredTally(devices: 2, first: 100)
        var acked = RangeSet()
        acked.insert(0..<3)
        for q in 0..<3 { t.add(id: Substring(StoredTally.recordId(runId: "r1", device: 101, seq: Int64(q))), runId: "r1") }
        t.add(id: "r1.101.2", runId: "r1")
        t.add(id: "r1.99.0", runId: "r1")  // the process below
        t.add(id: "r1.102.0", runId: "r1")  // the process above
        #expect(t.lost(device: 101, acked: acked) == 0)
        #expect(t.lost(device: 100, acked: acked) == 3)
        #expect(t.has(device: 101, seq: 2) && !t.has(device: 1, seq: 2) && !t.has(device: 102, seq: 0))
        #expect(t.read == 3 && t.duplicates == 1 && t.peer == 2 && t.foreign == 0)
    }

    @Test func aPeersStatusIsFinalOnceItsLoadEndedWithEverySendAnswered() throws {
        let text = #"{"phase":"draining","sendsPending":0,"broadcasts":[{"fsid":"r1-0-3","sentAtMs":1700000000123}]}"#
        let p = try #require(PeerStatus.parse(Array(text.utf8)))
        #expect(p.final)
        #expect(p.broadcasts == [.init(fsid: "r1-0-3", sentAtMs: 1_700_000_000_123)])
        #expect(PeerStatus.parse(Array(#"{"phase":"load","sendsPending":0,"broadcasts":[]}"#.utf8))?.final == false)
        #expect(PeerStatus.parse(Array(#"{"phase":"draining","sendsPending":2}"#.utf8))?.final == false)
        #expect(PeerStatus.parse(Array(#"{"phase":"done","broadcasts":[{"fsid":"x"}]}"#.utf8)) == nil)
        #expect(PeerStatus.parse(Array("{\"phase\":".utf8)) == nil)  // a torn read: not final
    }

    @Test func outagesAreClearDropsBelowWhatHadConnected() {
        var c = Connectivity()
        c.update(nowMs: 0, connected: 3, target: 3)  // the ramp: connected keeps up with the target
        c.update(nowMs: 50, connected: 299, target: 300)  // one device reconnecting: within the slack
        #expect(c.outages.isEmpty)
        c.update(nowMs: 100, connected: 300, target: 300)
        c.update(nowMs: 200, connected: 180, target: 300)
        c.update(nowMs: 300, connected: 20, target: 310)
        c.update(nowMs: 800, connected: 299, target: 320)
        c.update(nowMs: 900, connected: 300, target: 320)  // back to what it had before
        c.update(nowMs: 1000, connected: 100, target: 320)
        #expect(c.outages.count == 2)
        #expect(c.outages[0] == Connectivity.Outage(startMs: 200, endMs: 900, lowest: 20, target: 300))
        #expect(c.outages[0].durationMs == 700)
        #expect(c.outages[1].endMs == nil)
    }

    @Test func rateMeterIsPerSecond() {
        var m = RateMeter()
        m.sample(0, nowMs: 0)
        m.sample(500, nowMs: 2000)
        #expect(m.rate == 250)
    }
}

struct ProcAndOptionsTests {
    @Test func statFieldsAreCountedAfterTheCommandName() {
        let stat = "4242 (pylon (x) y) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 1 0 12345 1000000 500 0"
        #expect(ProcStat.cpuTicks(stat: stat) == 300)
        #expect(ProcStat.cpuTicks(stat: "garbage") == nil)
        #expect(ProcStat.parentPid(stat: stat) == 1)
        #expect(ProcStat.rssKiB(status: "Name:\tx\nVmRSS:\t  12345 kB\n") == 12345)
        #expect(ProcStat.cpuShare(ticks: 300, previous: 100, intervalMs: 2000, ticksPerSecond: 100) == 1.0)
        let w = ProcStat.parseWatchList("backend1 100\nbad\nnats2 x\nbroker 7\n")
        #expect(w.map(\.name) == ["backend1", "broker"])
    }

    @Test func optionsParseAndRefuse() throws {
        let o = try FleetOptions.parse([
            "--devices", "1000", "--rate", "10", "--broker", "127.0.0.1:1,localhost:2", "--backend", "http://x:1/", "--json",
        ])
        #expect(o.devices == 1000 && o.ratePerDevice == 10 && o.json)
        // A device posts as the uploader does by default: every 10 s, or once 50 events wait.
        #expect(o.batchIntervalMs == 10_000 && o.maxBatchRecords == 50)
        #expect(o.brokers == [.init(host: "127.0.0.1", port: 1), .init(host: "127.0.0.1", port: 2)])
        #expect(o.backend == "http://x:1")
        #expect(try FleetOptions.parse(["--broker-failover-ms", "30000"]).brokerFailoverMs == 30_000)
        let shard = try FleetOptions.parse([
            "--devices", "5000", "--first-device", "5000", "--name", "pylon-fleet2", "--peer-status-file", "/a", "--peer-status-file", "/b",
            "--broadcast-topic", "none",
        ])
        #expect(shard.firstDevice == 5000 && shard.processName == "pylon-fleet2" && shard.peerStatusFiles == ["/a", "/b"])
        #expect(shard.broadcastTopic.isEmpty && FleetOptions().broadcastTopic == "pylon/push/all")
        #expect(throws: FleetOptions.UsageError.self) { try FleetOptions.parse(["--broadcast-topic", "pylon/#"]) }
        #expect(FleetOptions().firstDevice == 0 && FleetOptions().processName == "pylon-fleet")
        #expect(throws: FleetOptions.UsageError.self) {
            try FleetOptions.parse(["--devices", "10", "--first-device", "\(FleetOptions.Limits.maxDevices - 5)"])
        }
        #expect(throws: FleetOptions.UsageError.self) { try FleetOptions.parse(["--name", "a b"]) }
        #expect(throws: FleetOptions.UsageError.self) { try FleetOptions.parse(["--broker-failover-ms", "5"]) }
        #expect(throws: FleetOptions.UsageError.self) { try FleetOptions.parse(["--devices", "0"]) }
        #expect(throws: FleetOptions.UsageError.self) { try FleetOptions.parse(["--devices", "\(FleetOptions.Limits.maxDevices + 1)"]) }
        #expect(throws: FleetOptions.UsageError.self) { try FleetOptions.parse(["--broker", "nohost"]) }
        #expect(throws: FleetOptions.UsageError.self) { try FleetOptions.parse(["--backend", "file:///etc/passwd"]) }
        #expect(throws: FleetOptions.UsageError.self) { try FleetOptions.parse(["--run-id", "a.b"]) }
        #expect(FDLimit.deviceCapacity(limit: 20_000, inflight: 256) == (20_000 - FleetOptions.Limits.fdReserve - 256) / 3)
        #expect(FDLimit.deviceCapacity(limit: 100, inflight: 256) == 0)
    }

    @Test func formatting() {
        #expect(Format.fixed(3.14159, 2) == "3.14")
        #expect(Format.fixed(-0.5, 0) == "-1")
        #expect(Format.fixed(2.05, 1) == "2.1" || Format.fixed(2.05, 1) == "2.0")
        #expect(Format.ms(1.25) == "1.3ms" || Format.ms(1.25) == "1.2ms")
        #expect(Format.ms(2410) == "2.41s")
        #expect(Format.pad("ab", 4) == "  ab")
    }
}
