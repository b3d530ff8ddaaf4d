# kubeadm join with a JoinConfiguration (API endpoint, token, CA hash; the certificate key for a control plane).
gk_kubeadm_lock
if [ -e /etc/kubernetes/kubelet.conf ]; then
  echo "@@gpuk8s-joined-elsewhere /etc/kubernetes/kubelet.conf exists"
  exit 3
fi
gk_secret_file {{ config }} {{ size }}
gk_to_the_end kubeadm-join kubeadm join --config {{ config }}
