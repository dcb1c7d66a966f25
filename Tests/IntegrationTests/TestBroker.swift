import Foundation
import PylonClientKit
import TestSupport

/// A real mosquitto broker on a free loopback port (`startMosquitto`: chosen, then confirmed by
/// mosquitto's log, another on "in use"), persistence on in its own directory, with
/// the configuration Pylon ships: no anonymous clients, mosquitto's dynamic-security plugin with
/// `adminUser` (the backend's login) as its admin, initialised by `tools/pylon-dynsec-init`.
final class TestBroker {
    let dir: String
    let port: Int
    private(set) var process: Process?
    static let adminUser = "pylon-backend"
    static let adminPassword = "itest-broker-admin-0123456789"
    var adminPasswordFile: String { dir + "/admin.password" }
    let autosaveInterval: Int
    var logPath: String { dir + "/mosquitto.log" }

    /// Debian's multiarch path of the dynamic-security plugin.
    static var dynsecPlugin: String {
        let dirs = (try? FileManager.default.contentsOfDirectory(atPath: "/usr/lib")) ?? []
        for d in dirs.sorted() where FileManager.default.fileExists(atPath: "/usr/lib/\(d)/mosquitto_dynamic_security.so") {
            return "/usr/lib/\(d)/mosquitto_dynamic_security.so"
        }
        return "/usr/lib/x86_64-linux-gnu/mosquitto_dynamic_security.so"
    }

    /// `autosaveInterval`: seconds between saves of the broker's database (what a kill -9 loses).
    init(autosaveInterval: Int = 1) throws {
        let dir = NSTemporaryDirectory() + "pylon-broker-" + UUID().uuidString.prefix(8)
        self.dir = dir
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        self.autosaveInterval = autosaveInterval
        let adminPasswordFile = dir + "/admin.password"
        try (TestBroker.adminPassword + "\n").write(toFile: adminPasswordFile, atomically: true, encoding: .utf8)
        chmod(adminPasswordFile, 0o600)
        let initTool = Process()
        initTool.executableURL = URL(fileURLWithPath: "/usr/bin/python3")
        initTool.arguments = [
            fixturesDir + "/../../tools/pylon-dynsec-init", dir + "/dynsec.json", TestBroker.adminUser, adminPasswordFile,
        ]
        try initTool.run()
        initTool.waitUntilExit()
        guard initTool.terminationStatus == 0 else { throw TestFailure(description: "pylon-dynsec-init failed") }
        let started = try startMosquitto(dir: dir, log: dir + "/mosquitto.log") { port in
            TestBroker.conf(dir: dir, port: port, autosaveInterval: autosaveInterval)
        }
        process = started.process
        port = started.port
    }

    static func conf(dir: String, port: Int, autosaveInterval: Int) -> String {
        """
        listener \(port) 127.0.0.1
        allow_anonymous false
        plugin \(TestBroker.dynsecPlugin)
        plugin_opt_config_file \(dir)/dynsec.json
        persistence true
        persistence_location \(dir)/
        autosave_interval \(autosaveInterval)
        set_tcp_nodelay true
        \(getuid() == 0 ? "user root" : "")
        log_dest file \(dir)/mosquitto.log
        """
    }

    /// Starts the broker again (after `stop`) on its own port: clients are configured with it.
    func start() throws {
        let (dir, autosaveInterval) = (dir, autosaveInterval)
        process = try startMosquitto(dir: dir, log: logPath, port: port) {
            TestBroker.conf(dir: dir, port: $0, autosaveInterval: autosaveInterval)
        }.process
    }

    /// Kills the broker (SIGKILL: Foundation starts children with SIGTERM blocked, and
    /// mosquitto does not unblock it). `autosave_interval 1` has saved its state meanwhile.
    func stop() {
        guard let p = process, p.isRunning else { return }
        kill(p.processIdentifier, SIGKILL)
        p.waitUntilExit()
        process = nil
    }

    deinit {
        stop()
        try? FileManager.default.removeItem(atPath: dir)
    }

    static func connect(_ port: Int) -> Int32? {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        var addr = sockaddr_in()
        addr.sin_family = sa_family_t(AF_INET)
        addr.sin_port = UInt16(port).bigEndian
        addr.sin_addr.s_addr = inet_addr("127.0.0.1")
        let rc = withUnsafePointer(to: &addr) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { Glibc.connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        if rc != 0 { close(fd); return nil }
        return fd
    }

    static func canConnect(_ port: Int) -> Bool {
        guard let fd = connect(port) else { return false }
        close(fd)
        return true
    }

    /// Publishes raw bytes with QoS 0 from a throwaway MQTT 3.1.1 connection (hand-built
    /// packets, so tests can send what no well-behaved publisher would), logged in as the admin.
    func publishRaw(topic: String, _ payload: [UInt8]) throws {
        guard let fd = TestBroker.connect(port) else { throw TestFailure(description: "cannot connect to the broker") }
        defer { close(fd) }
        func remaining(_ n: Int) -> [UInt8] {
            var n = n, out: [UInt8] = []
            repeat {
                var b = UInt8(n % 128)
                n /= 128
                if n > 0 { b |= 0x80 }
                out.append(b)
            } while n > 0
            return out
        }
        func str(_ s: String) -> [UInt8] { let u = Array(s.utf8); return [UInt8(u.count >> 8), UInt8(u.count & 0xFF)] + u }
        let connectBody =
            str("MQTT") + [4, 0xC2, 0, 60] + str("raw-" + UUID().uuidString.prefix(8)) + str(TestBroker.adminUser)
            + str(TestBroker.adminPassword)
        let connect = [0x10] + remaining(connectBody.count) + connectBody
        let pubBody = str(topic) + payload
        let publish = [0x30] + remaining(pubBody.count) + pubBody
        let all = connect + publish + [0xE0, 0x00]
        _ = all.withUnsafeBytes { send(fd, $0.baseAddress, $0.count, 0) }
        var buf = [UInt8](repeating: 0, count: 16)
        _ = buf.withUnsafeMutableBytes { recv(fd, $0.baseAddress, 4, 0) }  // CONNACK
        // The broker closes the connection on the DISCONNECT, which it reads after the PUBLISH:
        // end of stream means it has taken the message (10 s at most).
        var tv = timeval(tv_sec: 10, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
        while buf.withUnsafeMutableBytes({ recv(fd, $0.baseAddress, $0.count, 0) }) > 0 {}
    }
}

extension TestBroker {
    /// Runs `Tests/fixtures/mqtt_probe.py` as `uid` (an unprivileged local user by default) against
    /// this broker and returns its JSON result (`connack`, `suback`, `puback`, `messages`).
    func probe(uid: UInt32 = 65534, _ arguments: [String]) throws -> JSON {
        let p = Process()
        p.executableURL = URL(fileURLWithPath: "/usr/bin/setpriv")
        p.arguments =
            [
                "--reuid=\(uid)", "--regid=\(uid)", "--clear-groups", "/usr/bin/python3", "-c",
                try String(contentsOfFile: fixturesDir + "/mqtt_probe.py", encoding: .utf8), String(port),
            ] + arguments
        let out = Pipe()
        p.standardOutput = out
        try p.run()
        let data = out.fileHandleForReading.readDataToEndOfFile()
        p.waitUntilExit()
        return try JSON.parse(String(decoding: data, as: UTF8.self))
    }
}
