import Foundation
import PylonClientKit
import TestSupport
import Testing

/// The store parity cases the other backend suites do not cover (they run theirs over
/// `StoreKind.allCases` too): tag-manager versions and ETags, and push sends deduplicated by
/// msgKey through a real broker.
@Suite(.serialized) struct StoreParityTests {
    @Test(arguments: StoreKind.allCases) func containerVersionsETagsAndDrafts(_ store: StoreKind) throws {
        let b = try BackendProcess(store: store)
        let container: JSON = ["resource": ["macros": [], "tags": []]]
        let v1 = try b.post("/v1/admin/gtm/containers/c1/versions", ["container": container])
        #expect(v1["version"] == "1" && v1["published"] == true)
        let r1 = try b.request("GET", "/v1/gtm/containers/c1")
        #expect(r1.status == 200 && r1.headers["etag"] == "\"c1-v1\"")
        #expect(try r1.json()["resource"]?["version"] == "1")
        #expect(try b.request("GET", "/v1/gtm/containers/c1", headers: [("If-None-Match", "\"c1-v1\"")]).status == 304)
        let draft = try b.post("/v1/admin/gtm/containers/c1/versions", ["container": container, "draft": true, "gtmAuth": "tok"])
        #expect(draft["version"] == "2" && draft["published"] == false)
        #expect(try b.request("GET", "/v1/gtm/containers/c1/draft?gtm_auth=tok").status == 200)
        #expect(try b.request("GET", "/v1/gtm/containers/c1/draft?gtm_auth=bad").status == 403)
        #expect(try b.request("GET", "/v1/gtm/containers/c1", headers: [("If-None-Match", "\"c1-v1\"")]).status == 304)
        _ = try b.post("/v1/admin/gtm/containers/c1/versions", ["container": container])
        let r3 = try b.request("GET", "/v1/gtm/containers/c1", headers: [("If-None-Match", "\"c1-v1\"")])
        #expect(r3.status == 200 && r3.headers["etag"] == "\"c1-v3\"")
        let inspect = try b.get("/v1/inspect/gtm/containers/c1")
        #expect(inspect["versions"] == [1, 2, 3] && inspect["published"] == 3 && inspect["draft"] == 2)
        #expect(try b.request("GET", "/v1/gtm/containers/none").status == 404)
    }

    @Test(arguments: StoreKind.allCases) func pushSendsAreDedupedByMsgKeyAndRecordDeliveries(_ store: StoreKind) throws {
        let broker = try AnonymousBroker()
        let b = try BackendProcess(["--mqtt", "127.0.0.1:\(broker.port)"], store: store)
        let device = try b.post("/v1/devices/register", ["installId": "i1"])
        let token = try #require(device["token"]?.stringValue)
        let push = try b.request(
            "POST", "/v1/push/register", headers: [("Authorization", "Bearer " + token)], body: Array("{}".utf8))
        let pushToken = try #require(try push.json()["token"]?.stringValue)
        let send: JSON = ["appId": "a1", "targetType": "device", "target": .string(pushToken), "title": "t", "msgKey": "k1"]
        var first = JSON.null
        try waitUntil(timeout: 10) {
            let r = try b.request("POST", "/v1/admin/push/send", body: Array(send.serialized.utf8))
            if r.status == 200 { first = try r.json() }
            return r.status == 200
        }
        #expect(first["duplicate"] == false && first["devices"] == 1)
        let again = try b.post("/v1/admin/push/send", send)
        #expect(again["duplicate"] == true && again["msgId"] == first["msgId"])
        let other = try b.post(
            "/v1/admin/push/send", ["appId": "a1", "targetType": "device", "target": .string(pushToken), "msgKey": "k2"])
        #expect(other["duplicate"] == false)
        #expect(try b.get("/v1/inspect/push/sends")["sends"]?.arrayValue?.count == 2)
        let msgId = try #require(first["msgId"]?.stringValue)
        // The broker's PUBACK is recorded on the delivery.
        try waitUntil(timeout: 10) {
            try b.get("/v1/inspect/push/deliveries?msgId=\(msgId)")["deliveries"]?.arrayValue?.first?["pubackAt"]?.intValue != nil
        }
    }
}

/// mosquitto on a free loopback port, anonymous clients allowed (the backend's push tests need
/// a broker, not its access control), killed with SIGKILL.
final class AnonymousBroker {
    let dir: String
    let port: UInt16
    let process = Process()

    init() throws {
        dir = NSTemporaryDirectory() + "pylon-anon-broker-" + UUID().uuidString.prefix(8)
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        port = try freeLoopbackPort()
        let conf = """
            listener \(port) 127.0.0.1
            allow_anonymous true
            persistence false
            \(getuid() == 0 ? "user root" : "")
            """
        try conf.write(toFile: dir + "/mosquitto.conf", atomically: true, encoding: .utf8)
        process.executableURL = URL(fileURLWithPath: "/usr/sbin/mosquitto")
        process.arguments = ["-c", dir + "/mosquitto.conf"]
        process.standardOutput = FileHandle.nullDevice
        process.standardError = FileHandle.nullDevice
        try process.run()
        let port = self.port
        try waitUntil(timeout: 10) { (try? RawHTTPClient(port: port)) != nil }
    }

    deinit {
        if process.isRunning {
            kill(process.processIdentifier, SIGKILL)
            process.waitUntilExit()
        }
        try? FileManager.default.removeItem(atPath: dir)
    }
}

/// A port nothing listens on now (bound to 0, read back, closed).
func freeLoopbackPort() throws -> UInt16 {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    defer { close(fd) }
    var addr = sockaddr_in()
    addr.sin_family = sa_family_t(AF_INET)
    addr.sin_port = 0
    addr.sin_addr.s_addr = inet_addr("127.0.0.1")
    var len = socklen_t(MemoryLayout<sockaddr_in>.size)
    let ok = withUnsafeMutablePointer(to: &addr) { p in
        p.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, len) == 0 && getsockname(fd, $0, &len) == 0 }
    }
    guard ok else { throw TestFailure(description: "no free port") }
    return UInt16(bigEndian: addr.sin_port)
}
