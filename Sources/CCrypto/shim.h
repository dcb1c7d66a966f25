#ifndef PYLON_CCRYPTO_SHIM_H
#define PYLON_CCRYPTO_SHIM_H
/* OpenSSL's libcrypto, for the ed25519 signatures of NATS JWTs (the backend mints each device's
 * broker credential). Typed wrappers only: a raw 32-byte seed in, raw bytes out. */
#include <stddef.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <openssl/sha.h>

/* The public key of an ed25519 seed; 1 on success. */
static inline int pylon_ed25519_public(const unsigned char *seed, unsigned char *pub32) {
    EVP_PKEY *k = EVP_PKEY_new_raw_private_key(EVP_PKEY_ED25519, NULL, seed, 32);
    if (k == NULL) return 0;
    size_t n = 32;
    int ok = EVP_PKEY_get_raw_public_key(k, pub32, &n) == 1 && n == 32;
    EVP_PKEY_free(k);
    return ok;
}

/* An ed25519 signature (64 bytes) of msg with the key of seed; 1 on success. */
static inline int pylon_ed25519_sign(const unsigned char *seed, const unsigned char *msg, size_t len, unsigned char *sig64) {
    EVP_PKEY *k = EVP_PKEY_new_raw_private_key(EVP_PKEY_ED25519, NULL, seed, 32);
    if (k == NULL) return 0;
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    size_t n = 64;
    int ok = ctx != NULL && EVP_DigestSignInit(ctx, NULL, NULL, NULL, k) == 1 && EVP_DigestSign(ctx, sig64, &n, msg, len) == 1 && n == 64;
    EVP_MD_CTX_free(ctx);
    EVP_PKEY_free(k);
    return ok;
}

/* n cryptographically random bytes; 1 on success. */
static inline int pylon_random(unsigned char *out, int n) { return RAND_bytes(out, n); }

static inline void pylon_sha256(const unsigned char *d, size_t n, unsigned char *out32) { SHA256(d, n, out32); }
#endif
