/* libllama-rpc-fnv: the hash that names the entries of llama.cpp's RPC tensor cache ($LLAMA_CACHE/rpc/<hash>),
 * for the pre-fill (plugins/module_utils/llama_fnv.py loads it with ctypes). The same function as ggml-rpc.cpp's fnv_hash:
 * 64-bit FNV-1a, h ^= byte, h *= 0x100000001b3, from the offset basis 0xcbf29ce484222325, over the tensor's bytes.
 * Built with llama.cpp in every build group (role llamacpp) and shipped in the artifact's lib/. */
#include <stddef.h>
#include <stdint.h>

uint64_t llama_rpc_fnv1a(uint64_t hash, const unsigned char *data, size_t len) {
    const uint64_t prime = 0x100000001b3ULL;
    for (size_t i = 0; i < len; ++i) {
        hash ^= data[i];
        hash *= prime;
    }
    return hash;
}
