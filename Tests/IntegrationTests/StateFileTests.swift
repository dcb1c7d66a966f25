import Foundation
import PylonClientKit
import TestSupport
import Testing

/// The files in the state directory, end to end: a queue segment the uploader cannot read is
/// set aside and the rest drains (docs/UPLOADER.md "Quarantine"); every state file of the host
/// and its plugins is 0600, also one an earlier release left 0644 (docs/SECURITY.md "File
/// modes").
@Suite(.serialized) struct StateFileTests {
    /// Lines of the host's log holding `text`.
    func logLines(_ h: TestHost, _ text: String) -> Int { h.logText.split(separator: "\n").filter { $0.contains(text) }.count }

    /// Planted before a start: the symlink numbered past every segment, a directory and
    /// a file that is not a segment (mode 000: unreadable to any user but root, which these tests
    /// run as). The uploader runs (no exit 78), the records of the readable segment reach the
    /// backend, new ones too, the status names the three files, and each is logged once (not
    /// again at the next start).
    @Test func unreadableSegmentsAreQuarantinedAndTheQueueDrains() throws {
        let b = try TestBackend()
        let h = try TestHost(plugins: [TestHost.uploader(b, config: ["streams": ["s.*": ["maxCount": 500, "intervalMs": 600000]]])])
        let c = try h.client()
        #expect(try c.call("uploader.enqueue", ["stream": "s.q", "records": records("q", 0..<10)])["accepted"] == 10)
        h.stop()
        let queue = h.stateDir + "/plugins/uploader/uploader.queue"
        #expect(symlink("/etc/hostname", queue + "/0000000900.seg") == 0)
        #expect(mkdir(queue + "/0000000002.seg", 0o700) == 0)
        #expect(FileManager.default.createFile(atPath: queue + "/0000000003.seg", contents: Data(repeating: 0x7b, count: 64)))
        #expect(chmod(queue + "/0000000003.seg", 0) == 0)

        try h.start()
        try h.waitForPlugin("uploader")
        let c2 = try h.client()
        let st = try c2.call("uploader.status")
        let names: [JSON] = ["0000000002.seg.quarantined", "0000000003.seg.quarantined", "0000000900.seg.quarantined"]
        #expect(st["quarantinedFiles"] == 3, "\(st.serialized)")
        #expect(st["quarantined"] == .array(names))
        #expect(st["streams"]?["s.q"]?["queued"] == 10)
        #expect(MetricsText.render(bus: try h.status(), plugins: [("uploader", st)]).contains("pylon_uploader_quarantined_files 3"))
        #expect(try c2.call("uploader.enqueue", ["stream": "s.q", "records": records("q", 10..<15)])["accepted"] == 5)
        #expect(try c2.call("uploader.flush", ["stream": "s.q", "wait": true], timeoutMs: 30000)["drained"] == true)
        #expect(try b.recordIds("s.q") == Set((0..<15).map { "q-\($0)" }))
        var st2 = stat()
        #expect(lstat(queue + "/0000000900.seg.quarantined", &st2) == 0 && st2.st_mode & S_IFMT == S_IFLNK, "the link itself moved")
        #expect(logLines(h, "queue segment quarantined") == 3, "\(h.logText.suffix(3000))")

        h.stop()
        try h.start()
        try h.waitForPlugin("uploader")
        #expect(try h.client().call("uploader.status")["quarantinedFiles"] == 3)
        // The log starts afresh with the host: nothing set aside this time, nothing logged.
        #expect(logLines(h, "queue segment quarantined") == 0, "logged once, when set aside")
    }

    /// Every regular file under `dir` (recursively) with its permission bits.
    func modes(_ dir: String) -> [String: Int] {
        var out: [String: Int] = [:]
        guard let e = FileManager.default.enumerator(atPath: dir) else { return out }
        while let rel = e.nextObject() as? String {
            var st = stat()
            guard lstat(dir + "/" + rel, &st) == 0, st.st_mode & S_IFMT == S_IFREG else { continue }
            out[rel] = Int(st.st_mode & 0o7777)
        }
        return out
    }

    /// Databases pre-created 0644 (as an earlier release left them), the host and the uploader,
    /// MA, tag-manager and push plugins started and used under umask 022: every file in the
    /// state directory is 0600, the databases' `-wal` and `-shm` included. Then every file is
    /// made 0644 again (a stopped device's state) and a restart tightens each, logging it.
    @Test func everyStateFileIs0600() throws {
        let b = try TestBackend()
        let defaults = NSTemporaryDirectory() + "pylon-defaults-" + UUID().uuidString.prefix(8)
        try FileManager.default.createDirectory(atPath: defaults, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: defaults) }
        let stateDir = NSTemporaryDirectory() + "pylon-state-" + UUID().uuidString.prefix(8)
        defer { try? FileManager.default.removeItem(atPath: stateDir) }
        let old = umask(0o022)
        defer { umask(old) }
        for (plugin, db) in [("uploader", "uploader.db"), ("ma", "ma.db"), ("gtm", "gtm.db"), ("push", "push.db")] {
            let dir = stateDir + "/plugins/" + plugin
            try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
            #expect(FileManager.default.createFile(atPath: dir + "/" + db, contents: nil, attributes: [.posixPermissions: 0o644]))
        }
        let deadPort = try chooseFreeLoopbackPort()
        let plugins =
            TestHost.maPlugins(b)
            + [
                ["name": "gtm", "exec": "pylon-gtm", "backoffInitialMs": 50, "config": ["defaultsDir": .string(defaults)]],
                [
                    "name": "push", "exec": "pylon-push", "backoffInitialMs": 50,
                    "config": [
                        "backend": .string(b.baseURL), "credentialFile": .string(b.credentialFile),
                        "broker": ["host": "127.0.0.1", "port": .int(Int64(deadPort))],
                    ],
                ],
            ]
        let h = try TestHost(plugins: plugins, stateDir: stateDir)
        for p in ["uploader", "ma", "gtm", "push"] { try h.waitForPlugin(p) }
        // Activity: the uploader's queue, an MA session and events, tag-manager values kept
        // for a lifetime, a consent switch (the host's consent file).
        func use(_ round: Int) throws {
            let c = try h.client()
            let r = try c.call("uploader.enqueue", ["stream": "s.m", "records": records("m\(round)", 0..<5)])
            #expect(r["accepted"] == 5, "\(r.serialized)")
            // Whatever MA answers: its database is written either way.
            _ = try? c.call("ma.start", ["appKey": "modes"], timeoutMs: 30000)
            _ = try? c.call("ma.eventRecord", ["eventName": "open"])
            #expect(try c.call("gtm.push", ["data": ["kept": "1", "gtm.lifetime": "1h"]])["queued"] == true)
            _ = try c.call("consent.set", ["key": "s:m", "granted": true])
        }
        try use(1)
        let want = [
            "consent.json", "plugins/uploader/uploader.db", "plugins/uploader/uploader.db-wal", "plugins/uploader/uploader.db-shm",
            "plugins/ma/ma.db", "plugins/ma/ma.db-wal", "plugins/ma/ma.db-shm", "plugins/gtm/gtm.db", "plugins/gtm/gtm.lifetime",
            "plugins/push/push.db", "plugins/push/push.inbox",
        ]
        var seen = modes(stateDir)
        for f in want { #expect(seen[f] != nil, "\(f) exists: \(seen.keys.sorted())") }
        #expect(seen.keys.contains { $0.hasSuffix(".seg") })
        for (f, m) in seen.sorted(by: { $0.key < $1.key }) { #expect(m == 0o600, "\(f) is 0\(String(m, radix: 8))") }

        h.stop()
        // All but a credential (`device.token`: a looser one is refused as a secret, not
        // tightened).
        let loose = Set(modes(stateDir).keys.filter { !$0.hasSuffix("device.token") })
        for f in loose { #expect(chmod(stateDir + "/" + f, 0o644) == 0) }
        try h.start()
        for p in ["uploader", "ma", "gtm", "push"] { try h.waitForPlugin(p) }
        try use(2)
        seen = modes(stateDir)
        for (f, m) in seen.sorted(by: { $0.key < $1.key }) { #expect(m == 0o600, "\(f) is 0\(String(m, radix: 8)) after a restart") }
        let tightened = h.logText.split(separator: "\n").filter { $0.contains("state file mode tightened") }
        for f in loose {
            #expect(tightened.contains { $0.contains(f) }, "\(f): a tightening is logged")
        }
    }
}
