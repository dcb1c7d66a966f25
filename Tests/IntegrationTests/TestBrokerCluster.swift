import Foundation
import PylonClientKit
import TestSupport

/// A real three-node nats-server 2.9 cluster on free loopback ports, in its own directory: each
/// node with JetStream (the MQTT sessions and QoS 1 messages, replicated R3), cluster routes to
/// the others and an MQTT listener, under the decentralized JWT auth `tools/pylon-nats-auth init`
/// writes (operator, system account, the Pylon account and its signing key; no anonymous user).
/// Nodes are stopped with SIGKILL (nats-server keeps the SIGTERM mask Foundation gives children).
///
/// The node configuration is `TestBrokerCluster.nodeConfig`: one function, so the JetStream
/// cluster of the ingest tests can take the same nodes (one generator).
final class TestBrokerCluster {
    struct Node {
        let name: String
        let clientPort: Int
        let clusterPort: Int
        let mqttPort: Int
        var process: Process?
    }

    let dir: String
    var authDir: String { dir + "/auth" }
    private(set) var nodes: [Node] = []
    /// The backend's MQTT login (a bearer JWT) and its signing-key file.
    var backendPasswordFile: String { authDir + "/backend.jwt" }
    var backendAuthFile: String { authDir + "/backend-auth.json" }

    init(size: Int = 3) throws {
        dir = NSTemporaryDirectory() + "pylon-nats-" + UUID().uuidString.prefix(8)
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        let tool = Process()
        tool.executableURL = URL(fileURLWithPath: "/usr/bin/python3")
        tool.arguments = [fixturesDir + "/../../tools/pylon-nats-auth", "init", authDir]
        tool.standardOutput = FileHandle.nullDevice
        try tool.run()
        tool.waitUntilExit()
        guard tool.terminationStatus == 0 else { throw TestFailure(description: "pylon-nats-auth init failed") }
        for i in 1...size {
            nodes.append(
                Node(
                    name: "n\(i)", clientPort: try TestBroker.freePort(), clusterPort: try TestBroker.freePort(),
                    mqttPort: try TestBroker.freePort()))
        }
        let routes = nodes.map { "nats-route://127.0.0.1:\($0.clusterPort)" }
        for n in nodes {
            try TestBrokerCluster.nodeConfig(
                name: n.name, clientPort: n.clientPort, clusterPort: n.clusterPort, mqttPort: n.mqttPort, routes: routes,
                storeDir: dir + "/js-" + n.name, include: "auth/auth.conf"
            ).write(toFile: dir + "/\(n.name).conf", atomically: true, encoding: .utf8)
        }
        for i in nodes.indices { try start(i, wait: false) }
        for i in nodes.indices { try waitReady(i) }
    }

    /// One node's nats-server configuration: JetStream, cluster routes, the MQTT listener, and
    /// the auth include (operator JWT, MEMORY resolver) from `tools/pylon-nats-auth init`.
    static func nodeConfig(
        name: String, clientPort: Int, clusterPort: Int, mqttPort: Int?, routes: [String], storeDir: String, include: String?
    ) -> String {
        var c = """
            server_name: \(name)
            listen: 127.0.0.1:\(clientPort)
            jetstream { store_dir: "\(storeDir)", max_memory_store: 64MB, max_file_store: 512MB }
            cluster { name: pylon, listen: 127.0.0.1:\(clusterPort), routes: [\(routes.joined(separator: ", "))] }

            """
        // ack_wait: an unacknowledged QoS 1 message is sent again after this (default 30s).
        if let m = mqttPort { c += "mqtt { listen: 127.0.0.1:\(m), ack_wait: \"5s\" }\n" }
        if let inc = include { c += "include \(inc)\n" }
        return c
    }

    /// The MQTT addresses in node order, as `broker.brokers` / `--mqtt` take them.
    func mqttAddresses(_ order: [Int]? = nil) -> [String] {
        (order ?? Array(nodes.indices)).map { "127.0.0.1:\(nodes[$0].mqttPort)" }
    }

    /// `pylon-backend` arguments for this cluster, backend connections tried in `order`.
    func backendArgs(order: [Int]? = nil) -> [String] {
        [
            "--mqtt", mqttAddresses(order).joined(separator: ","), "--mqtt-username", "pylon-backend",
            "--mqtt-password-file", backendPasswordFile, "--mqtt-nats-auth", backendAuthFile,
        ]
    }

    func start(_ i: Int, wait: Bool = true) throws {
        let p = Process()
        p.executableURL = URL(fileURLWithPath: "/usr/sbin/nats-server")
        p.arguments = ["-c", dir + "/\(nodes[i].name).conf"]
        p.currentDirectoryURL = URL(fileURLWithPath: dir)
        let logPath = dir + "/\(nodes[i].name).log"
        _ = FileManager.default.createFile(atPath: logPath, contents: nil)
        let log = try FileHandle(forWritingTo: URL(fileURLWithPath: logPath))
        log.seekToEndOfFile()
        p.standardOutput = log
        p.standardError = log
        try p.run()
        nodes[i].process = p
        if wait { try waitReady(i) }
    }

    /// Waits until node `i` accepts an authenticated MQTT connection (its JetStream and the
    /// account's MQTT streams are up).
    func waitReady(_ i: Int, timeout: Double = 30) throws {
        let pw = try String(contentsOfFile: backendPasswordFile, encoding: .utf8).trimmingCharacters(in: .whitespacesAndNewlines)
        try waitUntil(timeout: timeout) {
            guard TestBroker.canConnect(nodes[i].mqttPort) else { return false }
            let r = try probe(node: i, ["--user", "pylon-backend", "--password", pw, "--wait-ms", "0"])
            return r["connack"]?.intValue == 0
        }
    }

    func kill9(_ i: Int) {
        guard let p = nodes[i].process, p.isRunning else { return }
        kill(p.processIdentifier, SIGKILL)
        p.waitUntilExit()
        nodes[i].process = nil
    }

    deinit {
        for i in nodes.indices { kill9(i) }
        try? FileManager.default.removeItem(atPath: dir)
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
                try String(contentsOfFile: fixturesDir + "/mqtt_probe.py", encoding: .utf8), String(nodes[i].mqttPort),
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
