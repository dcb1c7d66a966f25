import Foundation
import TestSupport
import Testing

/// `onFreePorts`, the one way the tests give ports to servers that cannot bind port 0
/// (mosquitto, nats-server clusters): a start that says a port was taken gets new ones.
@Suite struct FreePortTests {
    @Test func choosesDistinctPortsAndChoosesAgainWhenOneWasTaken() throws {
        var tried: [[Int]] = []
        let got = try onFreePorts(4, "server") { ports -> PortStart<[Int]> in
            tried.append(ports)
            return tried.count < 3 ? .taken("address already in use") : .started(ports)
        }
        #expect(tried.count == 3)
        #expect(got == tried.last)
        for ports in tried {
            #expect(Set(ports).count == 4, "distinct: \(ports)")
            #expect(ports.allSatisfy { (1...65535).contains($0) })
        }
    }

    @Test func givesUpAfterTheAttemptsSayingWhatTheServerSaid() {
        var attempts = 0
        let error = #expect(throws: TestFailure.self) {
            _ = try onFreePorts(1, "nats-server") { _ -> PortStart<Int> in
                attempts += 1
                return .taken("bind: address already in use \(attempts)")
            }
        }
        #expect(attempts == freePortAttempts)
        #expect(error?.description.hasPrefix("nats-server") == true)
        #expect(error?.description.hasSuffix("address already in use \(freePortAttempts)") == true, "\(String(describing: error))")
    }

    @Test func anotherFailureIsNotRetried() {
        var attempts = 0
        #expect(throws: TestFailure.self) {
            _ = try onFreePorts(2, "mosquitto") { _ -> PortStart<Int> in
                attempts += 1
                throw TestFailure(description: "mosquitto did not start: bad configuration")
            }
        }
        #expect(attempts == 1)
    }

    /// A port chosen free refuses connections: nothing listens on it.
    @Test func aChosenPortHasNoListener() throws {
        let port = try chooseFreeLoopbackPort()
        #expect(throws: (any Error).self) { try httpExchange(port: port, "GET", "/") }
    }
}

/// The servers' own words for a taken port, which `onFreePorts` relies on: with another
/// process listening on the port, mosquitto and nats-server each say so and exit (a new
/// version that words it differently fails here rather than making the retry silently fail).
@Suite(.serialized) struct PortTakenTests {
    @Test func mosquittoOnATakenPortSaysSo() throws {
        let dir = NSTemporaryDirectory() + "pylon-port-" + UUID().uuidString.prefix(8)
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let (fd, port) = try listenOnAFreePort()
        defer { close(fd) }
        let error = #expect(throws: TestFailure.self) {
            let s = try startMosquitto(dir: dir, log: dir + "/mosquitto.log", port: port) { port in
                "listener \(port) 127.0.0.1\nallow_anonymous true\n\(getuid() == 0 ? "user root" : "")\nlog_dest file \(dir)/mosquitto.log\n"
            }
            kill(s.process.processIdentifier, SIGKILL)
            s.process.waitUntilExit()
        }
        #expect(error?.description.contains("taken") == true, "\(String(describing: error))")
    }

    @Test func aNATSNodeStartedAgainOnATakenPortSaysSo() throws {
        let nats = try NATSCluster(nodes: 1)
        nats.kill(0)
        let fd = try listen(on: nats.nodes[0].clientPort)
        defer { close(fd) }
        let error = #expect(throws: TestFailure.self) { try nats.start(0) }
        #expect(error?.description.contains("address already in use") == true, "\(String(describing: error))")
    }

    func listenOnAFreePort() throws -> (fd: Int32, port: Int) {
        let port = try chooseFreeLoopbackPort()
        return (try listen(on: port), port)
    }

    func listen(on port: Int) throws -> Int32 {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        var one: Int32 = 1
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
        var addr = sockaddr_in()
        addr.sin_family = sa_family_t(AF_INET)
        addr.sin_addr.s_addr = inet_addr("127.0.0.1")
        addr.sin_port = UInt16(port).bigEndian
        let bound = withUnsafePointer(to: &addr) { p in
            p.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) == 0 }
        }
        guard bound, Glibc.listen(fd, 1) == 0 else {
            close(fd)
            throw TestFailure(description: "cannot listen on \(port): errno \(errno)")
        }
        return fd
    }
}
