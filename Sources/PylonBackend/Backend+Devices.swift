import PylonCore
import PylonStore

/// Device registration: `POST /v1/devices/register {installId}` issues the install's device
/// token, the one credential the device's plugins present (`Authorization: Bearer`) and the push
/// plugin's MQTT password (`Backend+Broker.swift`).
///
/// Who may register (docs/SECURITY.md, "Backend"):
/// - the enrolment secret (`--enrol-secret-file`): a new install, or an install again (a new
///   secret; the old token stops working: a device that lost its token re-enrols);
/// - the install's own device token: a new secret for it (rotation);
/// - nothing, under `--open-enrolment`: a new install only (409 for one already registered), so
///   an open backend hands out devices but never another device's identity.
extension Backend {
    /// The MQTT client id the push plugin of an install connects with (bound to its credential).
    static func mqttClientId(installId: String) -> String { "pylon-push-" + installId }

    func registerDevice(_ request: HTTPRequest, _ principal: Principal) throws(APIError) -> HTTPResponse {
        let body = try jsonBody(request)
        guard let install = body["installId"]?.stringValue, Backend.isValidInstallId(install) else {
            throw .badRequest(.invalidRequest, "installId must be 1 to 64 of [A-Za-z0-9._-]")
        }
        let existing = try storage { () throws(StoreError) in try store.deviceId(installId: install) }
        switch principal {
        case .device(_, let own) where own != install:
            throw .forbidden("a device token registers its own install only")
        case .anonymous where existing != nil:
            throw APIError(
                status: 409, code: .alreadyRegistered,
                message: "install \(install) is registered: present its device token (or the enrolment secret) to renew it")
        default: break
        }
        let id = existing ?? System.randomHex(8)
        let secret = System.randomHex(32)
        let now = System.wallClockMs()
        try storage { () throws(StoreError) in try store.saveDevice(id: id, installId: install, secret: secret, now: now) }
        let token = DeviceToken.make(deviceId: id, secret: secret)
        brokerAddDevice(deviceId: id, installId: install, password: token, renewed: existing != nil)
        var mqtt: JSONObject = [
            "username": .string(id), "clientId": .string(Backend.mqttClientId(installId: install)),
            "deviceTopic": .string(Backend.deviceTopic(id)), "ackTopic": .string(Backend.ackTopic(id)),
        ]
        // A nats-server cluster: the broker password is a user JWT for this device, not the token.
        if let auth = natsAuth {
            guard let jwt = auth.deviceJWT(deviceId: id, now: now) else {
                throw APIError(status: 500, code: .invalidRequest, message: "the device's broker credential could not be signed")
            }
            mqtt["password"] = .string(jwt)
        }
        log.info("device registered", ["deviceId": id, "renewed": existing != nil])
        return HTTPResponse(["deviceId": .string(id), "token": .string(token), "mqtt": .object(mqtt)])
    }

    /// 1 to 64 of `[A-Za-z0-9._-]` (the MQTT client id is `pylon-push-` and the install id).
    static func isValidInstallId(_ s: String) -> Bool {
        (1...64).contains(s.utf8.count)
            && s.utf8.allSatisfy { c in
                (0x30...0x39).contains(c) || (0x41...0x5A).contains(c) || (0x61...0x7A).contains(c) || c == 0x2E || c == 0x5F || c == 0x2D
            }
    }
}

extension APIError.Code {
    static let alreadyRegistered = APIError.Code(rawValue: "already_registered")
}
