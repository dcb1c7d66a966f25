import Foundation
import PylonClientKit
import TestSupport
import Testing

/// The stateless broker credentials (issue 34 item 1): a real mosquitto 2.0 with the project's
/// `pylon_auth` plugin (`tools/mosquitto-auth`, built here with its Makefile) and a backend
/// started with `--mqtt-auth-key-file`. Registering a device writes nothing to the broker; the
/// device connects with the token the backend signed, reads only its own topic, and is kicked
/// when revoked (SIGHUP), refused afterwards; a key rotation keeps the old kid's tokens valid
/// while both are listed.
@Suite(.serialized) struct MosquittoAuthTests {
    final class World {
        let dir: String
        let broker: Process
        let port: Int
        let backend: TestBackend

        init() throws {
            dir = NSTemporaryDirectory() + "pylon-mqauth-" + UUID().uuidString.prefix(8)
            try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
            let make = Process()
            make.executableURL = URL(fileURLWithPath: "/usr/bin/make")
            make.arguments = ["-s", "-C", repositoryRoot + "/tools/mosquitto-auth", "OUT=" + dir + "/pylon_auth.so"]
            try make.run()
            make.waitUntilExit()
            guard make.terminationStatus == 0 else { throw TestFailure(description: "the plugin did not build") }
            try World.write(dir + "/backend.key", "k1:" + String(repeating: "ab", count: 32))
            try World.write(dir + "/broker.keys", "k1:" + String(repeating: "ab", count: 32) + "\n")
            try World.write(dir + "/revoked", "")
            let d = dir
            // Started through python3, which clears the signal mask Foundation gives children
            // (SIGHUP must reach mosquitto: it is the plugin's reload).
            let started = try startMosquitto(dir: d, log: d + "/mosquitto.log", unmaskSignals: true) { port in
                """
                listener \(port) 127.0.0.1
                allow_anonymous false
                persistence false
                \(getuid() == 0 ? "user root" : "")
                log_dest file \(d)/mosquitto.log
                log_type all
                plugin \(d)/pylon_auth.so
                plugin_opt_key_file \(d)/broker.keys
                plugin_opt_revocation_file \(d)/revoked
                plugin_opt_backend_user pylon-backend
                """
            }
            broker = started.process
            port = started.port
            backend = try TestBackend(args: ["--mqtt", "127.0.0.1:\(port)", "--mqtt-auth-key-file", dir + "/backend.key"])
        }

        static func write(_ path: String, _ text: String) throws {
            try text.write(toFile: path, atomically: true, encoding: .utf8)
            chmod(path, 0o600)
        }

        func hup() { kill(broker.processIdentifier, SIGHUP) }

        var brokerLog: String { World.logText(dir) }

        static func logText(_ dir: String) -> String {
            (try? String(contentsOfFile: dir + "/mosquitto.log", encoding: .utf8)) ?? ""
        }

        /// `Tests/fixtures/mqtt_probe.py` against the broker.
        func probe(_ arguments: [String]) throws -> JSON {
            let p = Process()
            p.executableURL = URL(fileURLWithPath: "/usr/bin/python3")
            p.arguments = [fixturesDir + "/mqtt_probe.py", String(port)] + arguments
            let out = Pipe()
            p.standardOutput = out
            try p.run()
            let data = out.fileHandleForReading.readDataToEndOfFile()
            p.waitUntilExit()
            return try JSON.parse(String(decoding: data, as: UTF8.self))
        }

        /// Registers `install`: (device id, broker password, client id).
        func register(_ install: String) throws -> (id: String, password: String, clientId: String) {
            let r = try backend.request("POST", "/v1/devices/register", body: ["installId": .string(install)])
            guard r.status == 200, let id = r.json["deviceId"]?.stringValue, let pw = r.json["mqtt"]?["password"]?.stringValue,
                let cid = r.json["mqtt"]?["clientId"]?.stringValue
            else { throw TestFailure(description: "registration failed: \(r.status) \(r.json.serialized)") }
            return (id, pw, cid)
        }

        deinit {
            if broker.isRunning {
                kill(broker.processIdentifier, SIGKILL)
                broker.waitUntilExit()
            }
            try? FileManager.default.removeItem(atPath: dir)
        }
    }

    @Test func devicesConnectWithSignedTokensOnlyToTheirOwnTopics() throws {
        let w = try World()
        let a = try w.register("inst-a")
        let b = try w.register("inst-b")
        #expect(a.password.hasPrefix("pm1.k1."))
        #expect(!w.brokerLog.contains("inst-a"), "registration wrote nothing to the broker")

        let dTopic = "pylon/push/d/" + a.id
        let own = try w.probe([
            "--user", a.id, "--password", a.password, "--client-id", a.clientId, "--sub", dTopic, "--pub",
            "pylon/push/ack/" + a.id, "ok", "--until-acked",
        ])
        #expect(own["connack"] == 0)
        #expect(own["suback"] == [1])
        #expect(own["puback"] == 1)
        // Another client id, another device's name, a changed or foreign token, no token: refused.
        #expect(try w.probe(["--user", a.id, "--password", a.password, "--client-id", b.clientId])["connack"] == 5)
        #expect(try w.probe(["--user", b.id, "--password", a.password, "--client-id", a.clientId])["connack"] == 5)
        var forged = Array(a.password)
        forged[forged.count - 1] = forged.last == "0" ? "1" : "0"
        #expect(try w.probe(["--user", a.id, "--password", String(forged), "--client-id", a.clientId])["connack"] == 5)
        #expect(try w.probe(["--client-id", a.clientId])["connack"] == 5)
        #expect(try w.probe(["--user", "pylon-backend", "--password", a.password])["connack"] == 5)
        // A reads only its own topic: B's topic and wildcards are refused at subscribe.
        let other = try w.probe([
            "--user", a.id, "--password", a.password, "--client-id", a.clientId, "--sub",
            "pylon/push/d/" + b.id, "--sub", "pylon/push/d/#", "--until-acked",
        ])
        #expect(other["suback"] == [128, 128])

        // The backend's own signed login: its sends are published (503 without a connection).
        try waitUntil(timeout: 20) {
            try w.backend.request("POST", "/v1/admin/push/send", body: ["appId": "x", "targetType": "broadcast"]).status == 200
        }
    }

    @Test func aRevokedDeviceIsKickedAndRefusedAndKeysRotate() throws {
        let w = try World()
        let a = try w.register("inst-a")
        // A holds a connection for 15 s; the revocation (SIGHUP) must close it well before.
        let held = Process()
        held.executableURL = URL(fileURLWithPath: "/usr/bin/python3")
        held.arguments = [
            fixturesDir + "/mqtt_probe.py", String(w.port), "--user", a.id, "--password", a.password,
            "--client-id", a.clientId, "--sub", "pylon/push/d/" + a.id, "--wait-ms", "15000",
        ]
        let out = Pipe()
        held.standardOutput = out
        try held.run()
        try waitUntil(timeout: 10) { w.brokerLog.contains("as \(a.clientId)") }
        try World.write(w.dir + "/revoked", a.id + "\n")
        w.hup()
        let data = out.fileHandleForReading.readDataToEndOfFile()
        held.waitUntilExit()
        let result = try JSON.parse(String(decoding: data, as: UTF8.self))
        // `closed`: the broker ended the connection; at the end of its 15 s the probe would have
        // left with `closed` false.
        #expect(result["closed"] == true, "kicked: \(result)")
        #expect(try w.probe(["--user", a.id, "--password", a.password, "--client-id", a.clientId])["connack"] == 5)
        #expect(w.brokerLog.contains("refused revoked device \(a.id)"))

        // Rotation: a new kid next to the old one; the backend signs with the new one, the old
        // token stays valid until its kid is removed.
        let b = try w.register("inst-b")
        try World.write(
            w.dir + "/broker.keys", "k1:" + String(repeating: "ab", count: 32) + "\nk2:" + String(repeating: "cd", count: 32) + "\n")
        w.hup()
        try waitUntil(timeout: 10) { w.brokerLog.contains("reloaded 2 keys") }
        #expect(try w.probe(["--user", b.id, "--password", b.password, "--client-id", b.clientId, "--until-acked"])["connack"] == 0)
        try World.write(w.dir + "/broker.keys", "k2:" + String(repeating: "cd", count: 32) + "\n")
        w.hup()
        try waitUntil(timeout: 10) { w.brokerLog.components(separatedBy: "reloaded 1 keys").count > 1 }
        #expect(try w.probe(["--user", b.id, "--password", b.password, "--client-id", b.clientId])["connack"] == 5, "k1 retired")
        // A backend signing with k2 (the rotated key file) registers a device the broker takes.
        try World.write(w.dir + "/backend2.key", "k2:" + String(repeating: "cd", count: 32))
        let rotated = try TestBackend(args: ["--mqtt", "127.0.0.1:\(w.port)", "--mqtt-auth-key-file", w.dir + "/backend2.key"])
        let r = try rotated.request("POST", "/v1/devices/register", body: ["installId": "inst-c"])
        let c = (r.json["deviceId"]?.stringValue ?? "", r.json["mqtt"]?["password"]?.stringValue ?? "", "pylon-push-inst-c")
        #expect(c.1.hasPrefix("pm1.k2."))
        #expect(try w.probe(["--user", c.0, "--password", c.1, "--client-id", c.2, "--until-acked"])["connack"] == 0)
    }
}
