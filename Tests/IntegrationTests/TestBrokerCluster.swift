import Foundation
import PylonClientKit
import TestSupport

/// A real three-node nats-server 2.9 cluster on free loopback ports: `NATSCluster` (the one
/// generator, `tools/pylon-nats-cluster`: JetStream, routes) with, per node, an MQTT listener and
/// the decentralized JWT auth `tools/pylon-nats-auth init` writes (operator, system account, the
/// Pylon account and its signing key; no anonymous user). MQTT sessions and QoS 1 messages are
/// kept in JetStream, replicated R3. Nodes are stopped with SIGKILL.
final class TestBrokerCluster {
    let nats: NATSCluster
    let authDir: String
    let mqttPorts: [Int]
    /// Where the nodes' logs are (`<dir>/<name>.log`).
    var dir: String { nats.dir }
    var nodes: [NATSCluster.Node] { nats.nodes }
    /// The backend's MQTT login (a bearer JWT) and its signing-key file.
    var backendPasswordFile: String { authDir + "/backend.jwt" }
    var backendAuthFile: String { authDir + "/backend-auth.json" }

    init(size: Int = 3) throws {
        authDir = NSTemporaryDirectory() + "pylon-nats-auth-" + UUID().uuidString.prefix(8)
        let tool = Process()
        tool.executableURL = URL(fileURLWithPath: "/usr/bin/python3")
        tool.arguments = [repositoryRoot + "/tools/pylon-nats-auth", "init", authDir]
        tool.standardOutput = FileHandle.nullDevice
        try tool.run()
        tool.waitUntilExit()
        guard tool.terminationStatus == 0 else { throw TestFailure(description: "pylon-nats-auth init failed") }
        // Inlined, not included: nats-server resolves `include` relative to the node's config.
        let auth = try String(contentsOfFile: authDir + "/auth.conf", encoding: .utf8)
        let replicas = min(size, 3)
        nats = try NATSCluster(nodes: size, portsPerNode: 1) { _, ports in
            TestBrokerCluster.mqttConfig(port: ports[0], replicas: replicas) + auth
        }
        mqttPorts = nats.nodes.map { $0.extraPorts[0] }
        for i in 0..<size { try waitReady(i) }
    }

    /// A node's MQTT listener. `stream_replicas` explicitly: nats-server 2.9 otherwise takes the
    /// number of routes in the node's config, and a route list naming only the other nodes (as
    /// `pylon-nats-cluster` writes) gives R2 streams, which lose quorum when one node dies.
    /// `ack_wait`: an unacknowledged QoS 1 message is sent again after this (default 30 s).
    static func mqttConfig(port: Int, replicas: Int) -> String {
        "mqtt { listen: 127.0.0.1:\(port), stream_replicas: \(replicas), ack_wait: \"5s\" }\n"
    }

    /// The MQTT addresses in node order, as `broker.brokers` / `--mqtt` take them.
    func mqttAddresses(_ order: [Int]? = nil) -> [String] {
        (order ?? Array(nodes.indices)).map { "127.0.0.1:\(mqttPorts[$0])" }
    }

    /// `pylon-backend` arguments for this cluster, backend connections tried in `order`.
    func backendArgs(order: [Int]? = nil) -> [String] {
        [
            "--mqtt", mqttAddresses(order).joined(separator: ","), "--mqtt-username", "pylon-backend",
            "--mqtt-password-file", backendPasswordFile, "--mqtt-nats-auth", backendAuthFile,
        ]
    }

    /// Starts node `i` again (with its JetStream store) and waits until it serves MQTT.
    func start(_ i: Int) throws {
        try nats.start(i)
        try waitReady(i)
    }

    /// Waits until node `i` accepts an authenticated MQTT connection (its JetStream and the
    /// account's MQTT streams are up).
    func waitReady(_ i: Int, timeout: Double = 30) throws {
        let pw = try String(contentsOfFile: backendPasswordFile, encoding: .utf8).trimmingCharacters(in: .whitespacesAndNewlines)
        try waitUntil(timeout: timeout) {
            guard TestBroker.canConnect(mqttPorts[i]) else { return false }
            let r = try probe(node: i, ["--user", "pylon-backend", "--password", pw, "--wait-ms", "0"])
            return r["connack"]?.intValue == 0
        }
    }

    func kill9(_ i: Int) { nats.kill(i) }

    deinit {
        nats.stopAll()
        try? FileManager.default.removeItem(atPath: authDir)
    }

    /// Runs `Tests/fixtures/mqtt_probe.py` (a hand-built MQTT 3.1.1 client) against node `i` as
    /// an unprivileged uid and returns its JSON result (`connack`, `suback`, `puback`, `messages`).
    func probe(node i: Int, uid: UInt32 = 65534, _ arguments: [String]) throws -> JSON {
        try TestBrokerCluster.finish(try startProbe(node: i, uid: uid, arguments))
    }

    /// `probe` in the background: `finish` collects its result.
    func startProbe(node i: Int, uid: UInt32 = 65534, _ arguments: [String]) throws -> (Process, Pipe) {
        let p = Process()
        p.executableURL = URL(fileURLWithPath: "/usr/bin/setpriv")
        p.arguments =
            [
                "--reuid=\(uid)", "--regid=\(uid)", "--clear-groups", "/usr/bin/python3", "-c",
                try String(contentsOfFile: fixturesDir + "/mqtt_probe.py", encoding: .utf8), String(mqttPorts[i]),
            ] + arguments
        let out = Pipe()
        p.standardOutput = out
        try p.run()
        return (p, out)
    }

    static func finish(_ probe: (Process, Pipe)) throws -> JSON {
        let data = probe.1.fileHandleForReading.readDataToEndOfFile()
        probe.0.waitUntilExit()
        return try JSON.parse(String(decoding: data, as: UTF8.self))
    }

    /// A core NATS CONNECT with `jwt` on node `i`'s client port: the server's first answer
    /// after the INFO line (`PONG` when accepted, `-ERR …` when refused).
    func coreConnect(node i: Int, jwt: String) throws -> String {
        guard let fd = TestBroker.connect(nodes[i].clientPort) else { throw TestFailure(description: "no client port") }
        defer { close(fd) }
        var tv = timeval(tv_sec: 5, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
        let connect = "CONNECT " + JSON.object(["jwt": .string(jwt), "verbose": false, "protocol": 1]).serialized + "\r\nPING\r\n"
        _ = Array(connect.utf8).withUnsafeBytes { send(fd, $0.baseAddress, $0.count, 0) }
        var text = ""
        var buf = [UInt8](repeating: 0, count: 4096)
        while true {
            let n = buf.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            guard n > 0 else { break }
            text += String(decoding: buf[0..<n], as: UTF8.self)
            let lines = text.components(separatedBy: "\r\n").filter { !$0.isEmpty && !$0.hasPrefix("INFO ") }
            if let first = lines.first { return first }
        }
        return text
    }
}
