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

/// mosquitto on a free loopback port (`startMosquitto`), anonymous clients allowed (the backend's push tests need
/// a broker, not its access control), killed with SIGKILL.
final class AnonymousBroker {
    let dir: String
    let port: UInt16
    let process: Process

    init() throws {
        let dir = NSTemporaryDirectory() + "pylon-anon-broker-" + UUID().uuidString.prefix(8)
        self.dir = dir
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        let started = try startMosquitto(dir: dir, log: dir + "/mosquitto.log") { port in
            """
            listener \(port) 127.0.0.1
            allow_anonymous true
            persistence false
            \(getuid() == 0 ? "user root" : "")
            log_dest file \(dir)/mosquitto.log
            """
        }
        process = started.process
        port = UInt16(started.port)
    }

    deinit {
        if process.isRunning {
            kill(process.processIdentifier, SIGKILL)
            process.waitUntilExit()
        }
        try? FileManager.default.removeItem(atPath: dir)
    }
}
